"""A rollout worker process: an event loop of its own running episodes for the main process.

Started by :class:`~agentrl.rollout.workers.WorkerRunner` as
``python -P -m agentrl.rollout.worker_process READ_FD WRITE_FD EVENT_LOOP``. It reads
its :class:`~agentrl.rollout.wire.WorkerSpec`, imports the env modules, builds an
:class:`~agentrl.rollout.runner.EpisodeRunner` whose inference client
(:class:`_ProxyClient`) sends every generation call to the main process, and runs the
episodes it is handed. It sends, in order, each per-turn checkpoint of an episode and
then its end (both encoded as store rows: the main process only inserts them), and
each episode it parks at a closed gate with its checkpoint.

It owns nothing durable: the store, the scheduler and the engine are the main
process's. When the main process goes (its pipe closes), it stops.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import pickle
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.errors import InfraError
from agentrl.rollout.envside import sampled_tokens
from agentrl.rollout.episode import EpisodeProgress, EpisodeState
from agentrl.rollout.records import oldest_sampled_version
from agentrl.rollout.runner import EpisodeRunner
from agentrl.rollout.wire import (
    Channel,
    PromptsSent,
    WorkerSpec,
    error_from,
    error_payload,
    generation_from,
)
from agentrl.rollout.worker_envs import WorkerEnvs
from agentrl.runtime.metrics import LoopLagMonitor, Metrics, tune_gc
from agentrl.store.schema import PartialRow, segment_columns
from agentrl.types import PartialEpisode, RequestId, Task

logger = logging.getLogger(__name__)

WORKER_LAG = "worker_loop_lag_s"
"""The workers' event-loop lag samples, merged into the main process's metrics (its own
loop's stay ``loop_lag_s``)."""


class _ProxyClient:
    """The worker's inference client: every call goes to the main process's engine."""

    def __init__(
        self, channel: Channel, max_model_len: int, version: int, live: dict[str, EpisodeProgress]
    ) -> None:
        from agentrl.inference.base import InflightRequests

        self._channel = channel
        self._max_model_len = max_model_len
        self._version = version
        self._live = live
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._sampling: dict[Any, bytes] = {}
        self._ids = itertools.count()
        self.prompts = PromptsSent()
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
            future.set_result(generation_from(result[1:]))
        else:  # an error payload
            future.set_exception(error_from(result, "the inference engine"))

    async def abort(self, request_id: str) -> None:  # the main process aborts
        return None

    async def close(self) -> None:
        return None


class _WorkerEpisodeRunner(EpisodeRunner):
    """An :class:`EpisodeRunner` that tells the main process which episodes it parks."""

    channel: Channel
    epoch: int = 0
    remote_envs: bool = False

    async def _build(self, task: Task) -> Any:
        import gymnasium as gym

        from agentrl.env import load_env_plugins

        if self.remote_envs:  # made by the env servers' pool, not from the registry
            return await super()._build(task)
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
        self.channel.send(
            ("parked", ep.episode_id, self.epoch, snapshot, oldest, prefix, sampled_tokens(ep))
        )
        await super()._park(ep)


def _drain_metrics(
    metrics: Metrics,
) -> tuple[dict[str, float], dict[str, float], dict[str, list[float]]]:
    counters = dict(metrics.counters)
    samples = {k: list(v) for k, v in metrics.samples.items() if v}
    metrics.counters.clear()
    for v in metrics.samples.values():
        v.clear()
    return counters, dict(metrics.gauges), samples


class _Service:
    """One worker's episodes: started, cancelled and gated by the main process's messages."""

    def __init__(
        self, channel: Channel, spec: WorkerSpec, envs: WorkerEnvs | None, make: Any
    ) -> None:
        from agentrl.chat.formats import resolve_chat_format

        chat = resolve_chat_format(spec.tokenizer, spec.model) if spec.model is not None else None
        self.channel = channel
        self.gate = asyncio.Event()
        self.gate.set()
        self.metrics = Metrics()
        live: dict[str, EpisodeProgress] = {}
        self.proxy = _ProxyClient(channel, spec.max_model_len, spec.version, live)
        self.runner = _WorkerEpisodeRunner(
            self.proxy,
            spec.tokenizer,
            spec.rollout,
            metrics=self.metrics,
            admission=self.gate,  # type: ignore[arg-type]
            checkpoint=lambda p: channel.send(("partial", PartialRow.of(p))),
            chat=chat,
            **({"make": make} if make is not None else {}),
        )
        self.envs = envs
        self.runner.remote_envs = make is not None
        self.runner.live = live
        self.runner.channel = channel
        self.tasks: dict[int, asyncio.Task[None]] = {}

    async def _episode(self, key: int, episode_id: str, run: Callable[[], Any]) -> None:
        """Run one episode and send its end (its trajectories, its error or its cancellation)."""
        send = self.channel.send
        try:
            result = await run()
        except asyncio.CancelledError:
            send(("cancelled", key, _drain_metrics(self.metrics)))
            raise
        except BaseException as e:  # carried to the main process's episode
            send(("raised", key, error_payload(e), _drain_metrics(self.metrics)))
            return
        finally:
            self.tasks.pop(key, None)
            self.proxy.prompts.forget(episode_id)
        # Encoded for the store here, as checkpoints are: the main process only inserts.
        rows = [segment_columns(t) for t in result]
        send(("done", key, result, rows, _drain_metrics(self.metrics)))

    def _start(self, key: int, episode_id: str, run: Callable[[], Any]) -> None:
        self.tasks[key] = asyncio.create_task(
            self._episode(key, episode_id, run), name=f"episode-{episode_id}"
        )

    def handle(self, message: tuple[Any, ...]) -> bool:
        """Act on one message from the main process; False when it says stop."""
        what, proxy, runner = message[0], self.proxy, self.runner
        if what == "gen":
            proxy.answered(message[1], message[2], message[3])
        elif what == "run":
            _, key, task, episode_id, attempt, version = message
            proxy.saw(version)
            self._start(key, episode_id, lambda: runner.run(task, episode_id, attempt))
        elif what == "resume":
            _, key, partial, version = message
            proxy.saw(version)
            self._start(key, partial.episode_id, lambda: runner.resume(partial))
        elif what == "gate":
            _, is_open, epoch, version = message
            proxy.saw(version)
            runner.epoch = epoch
            self.gate.set() if is_open else self.gate.clear()
        elif what == "drop":
            _, episode_id, reason = message
            if episode_id in runner.parked:
                runner.drop(episode_id, reason)
        elif what == "env_targets":
            if self.envs is not None:
                self.envs.retarget(message[1])
        elif what == "cancel":
            task = self.tasks.get(message[1])
            if task is not None:
                task.cancel()
        return what != "stop"

    async def close(self) -> None:
        """Cancel the running episodes, then tell the main process the CPU time spent."""
        for task in list(self.tasks.values()):
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        self.runner.render_lane.close()
        self.channel.send(("stopped", time.process_time()))
        try:
            await self.channel.drain()
        except OSError as e:  # the main process is gone: nobody to tell
            logger.debug("rollout worker: %s: %s while stopping", type(e).__name__, e)
        self.channel.close()


async def _serve(read_fd: int, write_fd: int) -> None:
    await serve(await Channel.open(read_fd, write_fd))


async def serve(channel: Channel) -> None:
    """Be a worker on ``channel`` (pipes here; a TCP connection for a worker that is a
    Ray actor, :mod:`agentrl.cluster.workers`) until the main process says stop or goes."""
    from agentrl.env import import_env_modules, load_env_plugins

    kind, spec = await channel.recv()
    assert kind == "init", kind
    for p in reversed(spec.sys_path):
        if p not in sys.path:
            sys.path.insert(0, p)
    load_env_plugins()
    import_env_modules(list(spec.imports))
    envs = WorkerEnvs(spec.env_servers) if spec.env_servers is not None else None
    try:
        make = await envs.open() if envs is not None else None
        await _run(channel, _Service(channel, spec, envs, make))
    finally:
        if envs is not None:
            await envs.close()


async def _run(channel: Channel, service: _Service) -> None:
    tune_gc()  # as the main process does once started: fewer, cheaper collections
    loop = type(asyncio.get_running_loop())
    channel.send(("ready", os.getpid(), time.process_time(), f"{loop.__module__}.{loop.__name__}"))
    lag = LoopLagMonitor(service.metrics, name=WORKER_LAG).start()
    try:
        while True:
            try:
                message = await channel.recv()
            except (asyncio.IncompleteReadError, ConnectionError):
                break  # the main process is gone
            if not service.handle(message):
                break
    finally:
        await lag.stop()
        await service.close()


def _worker_main(argv: list[str]) -> None:
    read_fd, write_fd, event_loop = int(argv[0]), int(argv[1]), argv[2]
    # agentrl's warnings (an env that does not replay, ...) and everyone's errors
    logging.basicConfig(level=logging.ERROR, format="rollout worker: %(levelname)s %(message)s")
    logging.getLogger("agentrl").setLevel(logging.WARNING)
    with asyncio.Runner(loop_factory=loop_factory(event_loop)) as runner:
        runner.run(_serve(read_fd, write_fd))
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing more to show
            pass
    # No interpreter teardown: triton (imported with vLLM's parsers) prints hundreds of
    # "nanobind: leaked ..." lines there, into the terminal of the run.
    os._exit(0)


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop ``rollout.worker_event_loop`` names (None: asyncio's own)."""
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None


if __name__ == "__main__":
    _worker_main(sys.argv[1:])
