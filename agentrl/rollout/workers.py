"""Rollout worker processes: the episodes' CPU work on several cores, one engine, one store.

One event loop runs every episode's chat-template rendering, tokenization, parsing, env
and tool calls and checkpoint building, all in one process (one GIL): on a fast engine
that loop is the ceiling (``benchmarks/bench_ceiling.py``). With ``rollout.workers = N``
(N > 1) the episodes run in N worker processes instead, each an event loop of its own
with its own :class:`~agentrl.rollout.runner.EpisodeRunner`, tokenizer and env threads.
Their loops are uvloop's (``rollout.worker_event_loop``): the pipes, tasks and
wake-ups of a worker cost less there (0.9 of the workers' CPU per turn).

What must be one stays in the main process: the inference client (a worker's generation
call is sent to it and answered from it), the :class:`~agentrl.rollout.Scheduler`
(admission, groups, retries, the exactly-once accounting), the store writer and the
trainer's queue. :class:`WorkerRunner` stands in there for the ``EpisodeRunner``: the
scheduler, the :class:`~agentrl.rollout.controller.RolloutController` and the status
view drive it unchanged. It hands each episode to the worker with the fewest running.

The wire: two OS pipes per worker carrying length-prefixed pickles, read and written by
each side's event loop (writes are buffered: neither side ever blocks on the other).
A worker sends, in order, each per-turn checkpoint of an episode and then its end, so
the store sees them in the order one process would have written them.
Both arrive encoded as store rows (the worker encodes them, as one process would at
the write), so the main process, the one part of a run that does not scale out, only
inserts them. A generation request carries the episode's prompt as what it adds to the
episode's previous one where it extends it (:class:`_PromptsSent`,
:class:`_PromptsReceived`): every turn's prompt holds the whole conversation, and
pickling it both ways grew with the context (146 us a turn at 5,000 tokens).

Weight updates: the admission gate is the main process's (:class:`_Gate`); closing it
closes the workers' gates (a message that precedes the aborted generations on the same
pipe), and a generation request that crossed it on the way is held in the main process
until it opens, so no request reaches the engine during an update. A worker reports
each episode it parks with its checkpoint, so the controller writes them, drops them
(``drop`` policy) and counts their prefixes as it does for one process.

A worker that dies fails the run with :class:`~agentrl.errors.InfraError`, as an engine
failure does: its unfinished episodes keep their last checkpoints in the store and
``--resume`` continues them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import importlib.util
import itertools
import logging
import operator
import os
import pickle
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentrl.config import ModelConfig, RolloutConfig
from agentrl.errors import ConfigError, ContextOverflowError, InfraError
from agentrl.inference.base import Generation
from agentrl.metrics import LoopLagMonitor, Metrics, tune_gc
from agentrl.rollout.base import Runner
from agentrl.rollout.envside import sampled_tokens
from agentrl.rollout.episode import EpisodeDropped, EpisodeProgress, EpisodeState
from agentrl.rollout.runner import EpisodeRunner, oldest_sampled_version
from agentrl.store.schema import PartialRow, encoded, segment_columns
from agentrl.trace import ROLLOUT, EpisodeTrace
from agentrl.types import PartialEpisode, RequestId, Task, Trajectory

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 300.0
"""How long a worker may take to start (import, tokenizer, env modules)."""

_HEADER = 8

WORKER_LAG = "worker_loop_lag_s"
"""The workers' event-loop lag samples, merged into the main process's metrics (its own
loop's stay ``loop_lag_s``)."""

_GENERATION_FIELDS = tuple(f.name for f in dataclasses.fields(Generation))
"""A generation crosses as ``(None, *these fields)``: cheaper than pickling the object."""
_generation_values = operator.attrgetter(*_GENERATION_FIELDS)


def _generation(values: Sequence[Any]) -> Generation:
    """The generation whose fields crossed as ``values``, not checked again: it was
    checked where the main process's client made it (2.7 -> 1.1 us a turn)."""
    gen = object.__new__(Generation)
    for name, value in zip(_GENERATION_FIELDS, values, strict=True):
        object.__setattr__(gen, name, value)
    return gen


class _Channel:
    """Length-prefixed pickles over a pair of pipes, on the running event loop.

    Messages sent in one pass of the loop go out as one pickled batch in one write (a
    turn sends two to four; a write and the wake-up it causes on the other side cost
    more than pickling a message), in the order they were sent; :meth:`recv` hands them
    out one by one.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._out: list[tuple[Any, ...]] = []
        self._in: collections.deque[tuple[Any, ...]] = collections.deque()

    @classmethod
    async def open(cls, read_fd: int, write_fd: int) -> _Channel:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2**31)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", buffering=0)
        )
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(write_fd, "wb", buffering=0)
        )
        writer = asyncio.StreamWriter(transport, protocol, None, loop)
        return cls(reader, writer)

    def send(self, message: tuple[Any, ...]) -> None:
        """Queue ``message``; it is written at the end of this pass of the loop."""
        if self.writer.is_closing():
            return
        self._out.append(message)
        if len(self._out) == 1:
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write the queued messages now (one batch)."""
        out, self._out = self._out, []
        if not out or self.writer.is_closing():
            return
        data = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        self.writer.write(len(data).to_bytes(_HEADER, "little") + data)

    async def drain(self) -> None:
        """Write the queued messages and wait until the pipe took them."""
        self.flush()
        await self.writer.drain()

    async def recv(self) -> tuple[Any, ...]:
        """The next message; raises ``asyncio.IncompleteReadError`` when the other side is gone."""
        if not self._in:
            size = int.from_bytes(await self.reader.readexactly(_HEADER), "little")
            self._in.extend(pickle.loads(await self.reader.readexactly(size)))
        return self._in.popleft()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.flush()
            self.writer.close()


# -- what crosses the wire ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to build its runner (sent once, pickled)."""

    index: int
    tokenizer: Any
    rollout: RolloutConfig
    model: ModelConfig | None
    imports: tuple[str, ...]
    sys_path: tuple[str, ...]
    max_model_len: int
    version: int


def _error_payload(e: BaseException) -> tuple[Any, ...]:
    if isinstance(e, EpisodeDropped):
        return ("dropped", e.reason, e.tokens_discarded)
    if isinstance(e, ContextOverflowError):
        return ("overflow", e.prompt_tokens, e.max_model_len)
    if isinstance(e, InfraError):
        return ("infra", str(e))
    return ("other", f"{type(e).__name__}: {e}")


def _error(payload: tuple[Any, ...], where: str, episode_id: str = "") -> BaseException:
    kind = payload[0]
    if kind == "dropped":
        return EpisodeDropped(episode_id, payload[1], payload[2])
    if kind == "overflow":
        return ContextOverflowError(payload[1], payload[2])
    if kind == "infra":
        return InfraError(payload[1])
    return InfraError(f"{where} raised {payload[1]}")


# -- prompts: each as what it adds to the episode's previous one --------------------------


PromptPayload = list[int] | tuple[int, int, list[int]]
"""A prompt on the wire: whole, or ``(n, k, tail)`` (see :class:`_PromptsSent`)."""


class _PromptsSent:
    """The worker's side: the last prompt sent for each running episode.

    A turn's prompt is the conversation so far, the previous turn's prompt plus what came
    since (the sampled turn, the env's reply). It is sent as ``(n, k, tail)``: the first
    ``k`` tokens are those of the prompt of request ``n``, ``tail`` follows. Whether it
    extends that prompt is checked token for token (a comparison in C: 5 us at 5,000
    tokens, against 49 us to pickle them and 73 to unpickle); a prompt that does not (a
    new template segment, a cut-off turn dropped) goes whole.
    """

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, list[int]]] = {}

    def payload(self, episode_id: str, n: int, prompt: list[int]) -> PromptPayload:
        """What request ``n`` of ``episode_id`` sends for ``prompt`` (kept: not to be changed)."""
        last = self._last.get(episode_id)
        self._last[episode_id] = (n, prompt)
        if last is not None:
            base, tokens = last
            k = len(tokens)
            if len(prompt) >= k and prompt[:k] == tokens:
                return (base, k, prompt[k:])
        return prompt

    def forget(self, episode_id: str) -> None:
        """The episode ended (a retry or a resume starts with a whole prompt)."""
        self._last.pop(episode_id, None)

    def __len__(self) -> int:
        return len(self._last)


class _PromptsReceived:
    """The main process's side: the last prompt each worker sent for each episode."""

    def __init__(self) -> None:
        self._last: dict[tuple[int, str], tuple[int, list[int]]] = {}

    def prompt(self, key: tuple[int, str], n: int, payload: PromptPayload) -> list[int]:
        """The whole prompt of request ``n`` (``key``: the worker's index, the episode).

        Raises:
            InfraError: the payload extends a prompt this side does not hold (the two
                sides disagree: a bug, never a wrong prompt sent to the engine).
        """
        if isinstance(payload, tuple):
            base, k, tail = payload
            last = self._last.get(key)
            if last is None or last[0] != base or len(last[1]) != k:
                raise InfraError(
                    f"rollout worker {key[0]} sent episode {key[1]!r}'s prompt as an "
                    f"extension of request {base} ({k} tokens), which the main process does "
                    f"not hold ({'nothing' if last is None else f'request {last[0]}'}): the "
                    "two sides disagree; please report this with the run's log"
                )
            prompt = last[1] + tail
        else:
            prompt = payload
        self._last[key] = (n, prompt)
        return prompt

    def forget(self, key: tuple[int, str]) -> None:
        self._last.pop(key, None)

    def __len__(self) -> int:
        return len(self._last)


# -- the worker process ------------------------------------------------------------------


class _ProxyClient:
    """The worker's inference client: every call goes to the main process's engine."""

    def __init__(self, channel: _Channel, max_model_len: int, version: int,
                 live: dict[str, EpisodeProgress]) -> None:  # fmt: skip
        from agentrl.inference.base import InflightRequests

        self._channel = channel
        self._max_model_len = max_model_len
        self._version = version
        self._live = live
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._sampling: dict[Any, bytes] = {}
        self._ids = itertools.count()
        self.prompts = _PromptsSent()
        self.requests = InflightRequests()  # always empty: the main process's client aborts

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    async def generate(self, prompt_token_ids: Sequence[int], sampling: Any, request_id: str):
        n = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[n] = future
        episode_id = RequestId.parse(request_id).episode_id
        progress = self._live.get(episode_id)
        turn = progress.turn if progress is not None else 0
        tool_calls = progress.tool_calls if progress is not None else 0
        blob = self._sampling.get(sampling)
        if blob is None:  # a turn's parameters repeat: pickled once, read once (main side)
            blob = self._sampling[sampling] = pickle.dumps(sampling)
        prompt = self.prompts.payload(episode_id, n, list(prompt_token_ids))
        self._channel.send(("gen", n, prompt, blob, request_id, episode_id, turn, tool_calls))
        try:
            return await future
        except asyncio.CancelledError:
            if not future.done():
                self._channel.send(("ungen", n))
            raise
        finally:
            self._pending.pop(n, None)

    def saw(self, version: int) -> None:
        """The main process's engine is at ``version`` (it only goes up)."""
        self._version = max(self._version, version)

    def answered(self, n: int, result: Any, version: int) -> None:
        self.saw(version)
        future = self._pending.get(n)
        if future is None or future.done():
            return
        if result[0] is None:  # a generation's fields
            future.set_result(_generation(result[1:]))
        else:  # an error payload
            future.set_exception(_error(result, "the inference engine"))

    async def abort(self, request_id: str) -> None:  # the main process aborts
        return None

    async def close(self) -> None:
        return None


class _WorkerEpisodeRunner(EpisodeRunner):
    """An :class:`EpisodeRunner` that tells the main process which episodes it parks."""

    channel: _Channel
    epoch: int = 0

    async def _build(self, task: Task) -> Any:
        import gymnasium as gym

        from agentrl.env import load_env_plugins

        if task.env_id not in gym.registry:
            load_env_plugins()
        if task.env_id not in gym.registry:  # every episode would fail the same way
            raise InfraError(
                f"env {task.env_id!r} is not registered in the rollout worker processes: "
                "register it in a module listed in env.imports (or an agentrl.envs plugin) "
                "rather than only in the launching script, or set rollout.workers = 1"
            )
        return await super()._build(task)

    async def _park(self, ep: EpisodeState) -> None:
        try:
            snapshot: PartialEpisode | None = self._snapshot(ep)
        except Exception:  # an env whose get_state raises: its per-turn checkpoint stands
            snapshot = None
        oldest = oldest_sampled_version(ep.conversation)
        prefix = len(ep.conversation or ())
        self.channel.send(("parked", ep.episode_id, self.epoch, snapshot, oldest, prefix,
                           sampled_tokens(ep)))  # fmt: skip
        await super()._park(ep)


def _drain_metrics(metrics: Metrics) -> tuple[dict[str, float], dict[str, float],
                                              dict[str, list[float]]]:  # fmt: skip
    counters = dict(metrics.counters)
    samples = {k: list(v) for k, v in metrics.samples.items() if v}
    metrics.counters.clear()
    for v in metrics.samples.values():
        v.clear()
    return counters, dict(metrics.gauges), samples


async def _serve(read_fd: int, write_fd: int) -> None:
    from agentrl.chat.formats import resolve_chat_format
    from agentrl.env import import_env_modules, load_env_plugins

    channel = await _Channel.open(read_fd, write_fd)
    kind, spec = await channel.recv()
    assert kind == "init", kind
    for p in reversed(spec.sys_path):
        if p not in sys.path:
            sys.path.insert(0, p)
    load_env_plugins()
    import_env_modules(list(spec.imports))
    chat = resolve_chat_format(spec.tokenizer, spec.model) if spec.model is not None else None
    gate = asyncio.Event()
    gate.set()
    metrics = Metrics()
    live: dict[str, EpisodeProgress] = {}
    proxy = _ProxyClient(channel, spec.max_model_len, spec.version, live)
    runner = _WorkerEpisodeRunner(
        proxy, spec.tokenizer, spec.rollout, metrics=metrics, admission=gate,  # type: ignore[arg-type]
        checkpoint=lambda p: channel.send(("partial", PartialRow.of(p))), chat=chat,
    )  # fmt: skip
    runner.live = live
    runner.channel = channel
    tasks: dict[int, asyncio.Task[None]] = {}

    async def episode(key: int, episode_id: str, run: Callable[[], Any]) -> None:
        try:
            result = await run()
        except asyncio.CancelledError:
            channel.send(("cancelled", key, _drain_metrics(metrics)))
            return
        except BaseException as e:
            channel.send(("raised", key, _error_payload(e), _drain_metrics(metrics)))
            return
        finally:
            tasks.pop(key, None)
            proxy.prompts.forget(episode_id)
        # Encoded for the store here, as checkpoints are: the main process only inserts.
        rows = [segment_columns(t) for t in result]
        channel.send(("done", key, result, rows, _drain_metrics(metrics)))

    tune_gc()  # as the main process does once started: fewer, cheaper collections
    loop = type(asyncio.get_running_loop())
    channel.send(("ready", os.getpid(), time.process_time(), f"{loop.__module__}.{loop.__name__}"))
    lag = LoopLagMonitor(metrics, name=WORKER_LAG).start()
    try:
        while True:
            try:
                message = await channel.recv()
            except (asyncio.IncompleteReadError, ConnectionError):
                break  # the main process is gone
            what = message[0]
            if what == "gen":
                proxy.answered(message[1], message[2], message[3])
            elif what == "run":
                _, key, task, episode_id, attempt, version = message
                proxy.saw(version)
                tasks[key] = asyncio.create_task(episode(
                    key, episode_id, lambda t=task, e=episode_id, a=attempt: runner.run(t, e, a)
                ))  # fmt: skip
            elif what == "resume":
                _, key, partial, version = message
                proxy.saw(version)
                tasks[key] = asyncio.create_task(
                    episode(key, partial.episode_id, lambda p=partial: runner.resume(p))
                )
            elif what == "gate":
                _, is_open, epoch, version = message
                proxy.saw(version)
                runner.epoch = epoch
                gate.set() if is_open else gate.clear()
            elif what == "drop":
                _, episode_id, reason = message
                if episode_id in runner._parked:
                    runner.drop(episode_id, reason)
            elif what == "cancel":
                task = tasks.get(message[1])
                if task is not None:
                    task.cancel()
            elif what == "stop":
                break
    finally:
        await lag.stop()
        for task in list(tasks.values()):
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        runner.render_lane.close()
        channel.send(("stopped", time.process_time()))
        with contextlib.suppress(Exception):
            await channel.drain()
        channel.close()


def _worker_env() -> dict[str, str]:
    """The environment of a worker: this one, with this process's ``agentrl`` first on the
    path. The wire and the pickled objects are this version's; ``-P`` keeps the current
    directory (another checkout, say) from putting a different ``agentrl`` first."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, path] if path else [root])}


def _worker_main(argv: list[str]) -> None:
    read_fd, write_fd, event_loop = int(argv[0]), int(argv[1]), argv[2]
    # agentrl's warnings (an env that does not replay, ...) and everyone's errors
    logging.basicConfig(level=logging.ERROR, format="rollout worker: %(levelname)s %(message)s")
    logging.getLogger("agentrl").setLevel(logging.WARNING)
    with asyncio.Runner(loop_factory=_loop_factory(event_loop)) as runner:
        runner.run(_serve(read_fd, write_fd))
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    # No interpreter teardown: triton (imported with vLLM's parsers) prints hundreds of
    # "nanobind: leaked ..." lines there, into the terminal of the run.
    os._exit(0)


def _loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop ``rollout.worker_event_loop`` names (None: asyncio's own)."""
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None


# -- the main process --------------------------------------------------------------------


class _Gate(asyncio.Event):
    """The admission gate: opening or closing it opens or closes the workers' gates."""

    def __init__(self, owner: WorkerRunner) -> None:
        super().__init__()
        self._owner = owner
        self.epoch = 0

    def set(self) -> None:
        super().set()
        self._owner._gate_changed(True)

    def clear(self) -> None:
        self.epoch += 1
        super().clear()
        self._owner._gate_changed(False)


@dataclasses.dataclass
class _Parked:
    worker: int
    snapshot: PartialEpisode | None
    oldest: int | None
    prefix: int
    sampled: int


@dataclasses.dataclass
class _Worker:
    index: int
    process: asyncio.subprocess.Process
    channel: _Channel
    running: dict[int, str] = dataclasses.field(default_factory=dict)
    """Episode ids by dispatch key."""
    reader: asyncio.Task[None] | None = None
    cpu_s: float = 0.0
    """CPU seconds the worker spent between ready and stopped (while it runs: minus the
    reading at ready)."""
    event_loop: str = ""
    """The class of the worker's event loop (``uvloop.Loop``, ...)."""


class WorkerRunner:
    """Runs episodes in worker processes; drives like an :class:`EpisodeRunner`.

    Use as ``async with WorkerRunner(...) as runner:``; the workers start on entry (each
    imports ``agentrl``, the env modules and the tokenizer) and stop on exit.

    Args:
        client: the inference engine (every worker's generation calls come to it).
        tokenizer: the model's tokenizer (pickled to each worker, chat template included).
        config: limits and sampling; ``config.workers`` processes are started.
        metrics: where counts and timings go (the workers' are merged in as episodes end).
        checkpoint: called with each per-turn checkpoint a worker sends, encoded there
            (a :class:`~agentrl.store.schema.PartialRow`, which ``StoreWriter.partial``
            takes).
        model: the model config, for the chat format (None: detected from the tokenizer).
        imports: modules or .py files that register the envs (``env.imports``); the
            ``agentrl.envs`` plugins are loaded too.
        tracer: where each episode's phases go, as this process sees them: ``engine``
            while a generation runs, ``paused`` while parked for a weight update, and
            ``env`` between generations (the worker's env, tool and template work).
    """

    def __init__(
        self,
        client: Any,
        tokenizer: Any,
        config: RolloutConfig,
        *,
        metrics: Metrics | None = None,
        checkpoint: Callable[[PartialEpisode], Any] | None = None,
        model: ModelConfig | None = None,
        imports: Sequence[str] = (),
        tracer: Any = None,
    ) -> None:
        if config.workers < 2:
            raise ConfigError(
                f"rollout.workers = {config.workers}: a WorkerRunner needs 2 or more "
                "(one worker runs in the main process's EpisodeRunner)"
            )
        self.client = client
        self.tokenizer = tokenizer
        self.config = config
        self.metrics = metrics or Metrics()
        self.checkpoint = checkpoint
        self.model = model
        self.imports = tuple(imports)
        self.tracer = tracer
        self.live: dict[str, EpisodeProgress] = {}
        self._workers: list[_Worker] = []
        self._keys = itertools.count()
        self._results: dict[int, asyncio.Future[list[Trajectory]]] = {}
        self._generations: dict[tuple[int, int], asyncio.Task[None]] = {}
        self._prompts = _PromptsReceived()
        self._parked: dict[str, _Parked] = {}
        self._parked_changed = asyncio.Condition()
        self._sampling: dict[bytes, Any] = {}
        self._failed: BaseException | None = None
        self._closing = False
        self.worker_cpu_s = 0.0
        """After :meth:`close`: the CPU seconds the workers spent after they started."""
        self.admission: asyncio.Event = _Gate(self)
        self.admission.set()

    # -- lifecycle

    async def __aenter__(self) -> WorkerRunner:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Start the workers and wait until each has built its runner.

        Raises:
            ConfigError: ``rollout.worker_event_loop`` is uvloop and uvloop is not installed.
        """
        if self.config.worker_event_loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
            raise ConfigError(
                "rollout.worker_event_loop = 'uvloop', but uvloop is not installed in this "
                "environment; install it (`pip install uvloop`) or set "
                "rollout.worker_event_loop = 'asyncio'"
            )
        try:
            await asyncio.gather(*(self._spawn(i) for i in range(self.config.workers)))
        except BaseException:
            await self.close()
            raise

    async def _spawn(self, index: int) -> None:
        down_r, down_w = os.pipe()  # main -> worker
        up_r, up_w = os.pipe()  # worker -> main
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-P", "-m", "agentrl.rollout.workers", str(down_r), str(up_w),
                self.config.worker_event_loop,
                pass_fds=(down_r, up_w), stdin=asyncio.subprocess.DEVNULL, env=_worker_env(),
                start_new_session=True,  # Ctrl-C reaches this process, which stops them
            )  # fmt: skip
        finally:
            os.close(down_r)
            os.close(up_w)
        channel = await _Channel.open(up_r, down_w)
        worker = _Worker(index, process, channel)
        self._workers.append(worker)
        spec = WorkerSpec(index, self.tokenizer, self.config, self.model, self.imports,
                          tuple(sys.path), self.client.max_model_len,
                          self.client.version)  # fmt: skip
        channel.send(("init", spec))
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                message = await channel.recv()
        except (asyncio.IncompleteReadError, ConnectionError):
            code = await process.wait()
            raise InfraError(
                f"rollout worker {index} exited with code {code} while starting (its error is "
                "printed above); rollout.workers = 1 runs the episodes in this process"
            ) from None
        except TimeoutError:
            raise InfraError(
                f"rollout worker {index} did not start within {START_TIMEOUT_S:.0f} s"
            ) from None
        assert message[0] == "ready", message
        worker.cpu_s, worker.event_loop = -message[2], message[3]
        worker.reader = asyncio.create_task(self._read(worker), name=f"rollout-worker-{index}")

    async def close(self) -> None:
        """Stop the workers (their running episodes are cancelled there) and wait for them."""
        self._closing = True
        for w in self._workers:
            w.channel.send(("stop",))
        for w in self._workers:
            try:
                async with asyncio.timeout(30):
                    await w.process.wait()
            except TimeoutError:
                logger.warning("rollout worker %d did not stop in 30 s; killing it", w.index)
                with contextlib.suppress(ProcessLookupError):
                    w.process.kill()
                await w.process.wait()
            if w.reader is not None:  # it reads what is left, up to the end of the pipe
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(w.reader, 5)
            w.channel.close()
        for task in self._generations.values():
            task.cancel()
        self.worker_cpu_s += sum(w.cpu_s for w in self._workers)
        self._workers = []

    @property
    def event_loops(self) -> tuple[str, ...]:
        """The class of each running worker's event loop (``uvloop.Loop``, ...)."""
        return tuple(w.event_loop for w in self._workers)

    @property
    def pids(self) -> tuple[int, ...]:
        """The process ids of the running workers (empty before start and after close)."""
        return tuple(w.process.pid for w in self._workers)

    # -- what the scheduler calls

    async def run(self, task: Task, episode_id: str, attempt: int = 0) -> list[Trajectory]:
        version = self.client.version
        return await self._dispatch(
            ("run", task, episode_id, attempt, version), episode_id, task.env_id, version
        )

    async def resume(self, partial: PartialEpisode) -> list[Trajectory]:
        return await self._dispatch(
            ("resume", partial, self.client.version), partial.episode_id,
            partial.task.env_id, partial.started_version,
        )  # fmt: skip

    async def _dispatch(self, what: tuple[Any, ...], episode_id: str, env_id: str,
                        version: int) -> list[Trajectory]:  # fmt: skip
        if self._failed is not None:
            raise self._failed
        if not self._workers:
            raise InfraError("the rollout workers are not running (use `async with`)")
        if episode_id in self.live:
            raise ValueError(f"episode {episode_id!r} is already running")
        worker = min(self._workers, key=lambda w: len(w.running))
        key = next(self._keys)
        future: asyncio.Future[list[Trajectory]] = asyncio.get_running_loop().create_future()
        self._results[key] = future
        worker.running[key] = episode_id
        progress = self.live[episode_id] = EpisodeProgress(episode_id, env_id,
                                                           started_version=version)  # fmt: skip
        if self.tracer is not None and self.tracer.enabled:
            progress.trace = EpisodeTrace(self.tracer, episode_id, ROLLOUT)
            progress.set_phase(progress.phase)
        worker.channel.send((what[0], key, *what[1:]))
        try:
            return await future
        except asyncio.CancelledError:
            if key in worker.running:
                worker.channel.send(("cancel", key))
            raise
        finally:
            self._results.pop(key, None)
            worker.running.pop(key, None)
            self._prompts.forget((worker.index, episode_id))
            if progress.trace is not None:
                progress.trace.end()
            self.live.pop(episode_id, None)
            self._parked.pop(episode_id, None)
            await self._notify_parked()

    # -- what the controller calls

    @property
    def parked(self) -> tuple[str, ...]:
        return tuple(self._parked)

    def snapshot(self, episode_id: str) -> PartialEpisode:
        snapshot = self._parked[episode_id].snapshot
        if snapshot is None:
            raise KeyError(f"episode {episode_id!r} was parked without a checkpoint")
        return snapshot

    def oldest_version(self, episode_id: str) -> int | None:
        return self._parked[episode_id].oldest

    def prefix_tokens(self, episode_id: str) -> int:
        return self._parked[episode_id].prefix

    def drop(self, episode_id: str, reason: str) -> int:
        parked = self._parked[episode_id]
        self._workers_by_index()[parked.worker].channel.send(("drop", episode_id, reason))
        return parked.sampled

    async def wait_parked(self, episode_ids: set[str]) -> None:
        async with self._parked_changed:
            await self._parked_changed.wait_for(
                lambda: (
                    self._failed is not None
                    or all(e in self._parked or e not in self.live for e in episode_ids)
                )
            )
        if self._failed is not None:
            raise self._failed

    # -- internals

    def _episode_of(self, key: int) -> str:
        for w in self._workers:
            if key in w.running:
                return w.running[key]
        return ""

    def _workers_by_index(self) -> dict[int, _Worker]:
        return {w.index: w for w in self._workers}

    def _gate_changed(self, is_open: bool) -> None:
        self._parked.clear()
        epoch = self.admission.epoch  # type: ignore[attr-defined]
        for w in self._workers:
            w.channel.send(("gate", is_open, epoch, self.client.version))

    async def _notify_parked(self) -> None:
        async with self._parked_changed:
            self._parked_changed.notify_all()

    async def _read(self, worker: _Worker) -> None:
        channel = worker.channel
        try:
            for n in itertools.count(1):
                message = await channel.recv()
                self._handle(worker, message)
                if message[0] == "parked":
                    await self._notify_parked()
                elif n % 32 == 0:  # a burst already buffered is read without a pause
                    await asyncio.sleep(0)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        if self._closing:
            return
        code = await worker.process.wait()
        self._fail(InfraError(
            f"rollout worker {worker.index} (pid {worker.process.pid}) died with exit code "
            f"{code}; the run stops here (groups already completed were handed on and are "
            "kept; unfinished episodes resume from their checkpoints with --resume)"
        ))  # fmt: skip
        await self._notify_parked()

    def _fail(self, error: BaseException) -> None:
        if self._failed is None:
            self._failed = error
        for future in self._results.values():
            if not future.done():
                future.set_exception(error)

    def _handle(self, worker: _Worker, message: tuple[Any, ...]) -> None:
        what = message[0]
        if what == "gen":
            _, n, payload, sampling, request_id, episode_id, turn, tool_calls = message
            try:
                prompt = self._prompts.prompt((worker.index, episode_id), n, payload)
            except InfraError as e:  # the episode fails with it; the run stops
                worker.channel.send(("gen", n, _error_payload(e), self.client.version))
                return
            progress = self.live.get(episode_id)
            if progress is not None:
                progress.turn, progress.tool_calls = turn, tool_calls
                progress.set_phase("engine")
            self._generations[(worker.index, n)] = asyncio.create_task(
                self._generate(worker, n, prompt, sampling, request_id, progress)
            )
        elif what == "ungen":
            task = self._generations.pop((worker.index, message[1]), None)
            if task is not None:
                task.cancel()
        elif what == "stopped":
            worker.cpu_s += message[1]
        elif what == "partial":
            if self.checkpoint is not None:
                self.checkpoint(message[1])
        elif what == "parked":
            _, episode_id, epoch, snapshot, oldest, prefix, sampled = message
            if not self.admission.is_set() and epoch == self.admission.epoch:  # type: ignore[attr-defined]
                self._parked[episode_id] = _Parked(worker.index, snapshot, oldest, prefix, sampled)
                progress = self.live.get(episode_id)
                if progress is not None:
                    progress.set_phase("paused")
        elif what in ("done", "raised", "cancelled"):
            key, metrics = message[1], message[-1]
            self._merge(metrics)
            future = self._results.get(key)
            if future is None or future.done():
                return
            if what == "done":
                trajectories, rows = message[2], message[3]
                if self.checkpoint is not None:  # a store will save them: with these rows
                    trajectories = [encoded(t, r) for t, r in zip(trajectories, rows, strict=True)]
                future.set_result(trajectories)
            elif what == "raised":
                episode_id = self._episode_of(key)
                future.set_exception(
                    _error(message[2], f"rollout worker {worker.index}", episode_id)
                )
            else:
                future.cancel()

    async def _generate(self, worker: _Worker, n: int, prompt: list[int], sampling: bytes,
                        request_id: str, progress: EpisodeProgress | None) -> None:  # fmt: skip
        try:
            if not self.admission.is_set():  # sent before the worker saw the gate close
                await self.admission.wait()
            params = self._sampling.get(sampling)
            if params is None:
                params = self._sampling[sampling] = pickle.loads(sampling)
            gen = await self.client.generate(prompt, params, request_id)
            result: tuple[Any, ...] = (None, *_generation_values(gen))
            if progress is not None:
                progress.add_tokens(gen.versions)
                progress.set_phase("env")
        except asyncio.CancelledError:
            return  # the worker's episode was cancelled
        except BaseException as e:  # carried to the worker's episode
            result = _error_payload(e)
        finally:
            self._generations.pop((worker.index, n), None)
        worker.channel.send(("gen", n, result, self.client.version))

    def _merge(self, metrics: tuple[dict[str, float], dict[str, float],
                                    dict[str, list[float]]]) -> None:  # fmt: skip
        counters, gauges, samples = metrics
        self.metrics.counters.update(counters)
        self.metrics.gauges.update(gauges)
        for name, values in samples.items():
            self.metrics.samples[name].extend(values)


async def open_runner(
    stack: contextlib.AsyncExitStack,
    client: Any,
    tokenizer: Any,
    config: RolloutConfig,
    *,
    model: ModelConfig,
    imports: Sequence[str],
    metrics: Metrics | None = None,
    checkpoint: Callable[[PartialEpisode], Any] | None = None,
    tracer: Any = None,
    make: Callable[..., Any] | None = None,
) -> Runner:
    """The runner of a run: an :class:`EpisodeRunner` when ``config.workers`` is 1, else a
    started :class:`WorkerRunner` (closed by ``stack``).

    Raises:
        ConfigError: ``rollout.workers > 1`` with envs on env servers (``env.url``).
    """
    from agentrl.chat.formats import resolve_chat_format

    if config.workers == 1:
        extra = {"make": make} if make is not None else {}
        return EpisodeRunner(client, tokenizer, config, metrics=metrics, checkpoint=checkpoint,
                             tracer=tracer, chat=resolve_chat_format(tokenizer, model),
                             **extra)  # fmt: skip
    if make is not None:
        raise ConfigError(
            f"rollout.workers = {config.workers} with envs on env servers (env.url/urls): the "
            "env servers already run the envs in their own processes; set rollout.workers = 1"
        )
    runner = WorkerRunner(client, tokenizer, config, metrics=metrics, checkpoint=checkpoint,
                          model=model, imports=imports, tracer=tracer)  # fmt: skip
    return await stack.enter_async_context(runner)


if __name__ == "__main__":
    _worker_main(sys.argv[1:])
