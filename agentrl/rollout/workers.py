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

The wire (:mod:`agentrl.rollout.wire`): two OS pipes per worker carrying batched,
length-prefixed pickles. A worker (:mod:`agentrl.rollout.worker_process`) sends, in
order, each per-turn checkpoint of an episode and then its end, both encoded as store
rows, so the main process, the one part of a run that does not scale out, only inserts
them, in the order one process would have written them.

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
import contextlib
import dataclasses
import importlib.util
import itertools
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from agentrl.config import EnvConfig, ModelConfig, RolloutConfig
from agentrl.errors import ConfigError, InfraError
from agentrl.rollout.base import Runner
from agentrl.rollout.episode import EpisodeProgress
from agentrl.rollout.runner import EpisodeRunner
from agentrl.rollout.wire import EnvServers, PromptsReceived, Target, WorkerSpec
from agentrl.rollout.worker_messages import Parked, WorkerMessages, reader_failed
from agentrl.rollout.worker_spawn import Worker, spawn_worker
from agentrl.runtime.background import BackgroundTasks
from agentrl.runtime.metrics import Metrics
from agentrl.runtime.tracing import ROLLOUT, EpisodeTrace
from agentrl.store.schema import PartialRow
from agentrl.types import PartialEpisode, Task, Trajectory

logger = logging.getLogger(__name__)


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


class WorkerRunner(WorkerMessages):
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
        spawn: starts one worker: a local process, or a Ray actor (agentrl.cluster.workers).
        env_servers: the env servers each worker opens its own pool of (None: envs are
            made in the workers from Gymnasium's registry).
        restarts: how many dead workers are started again during the run, their
            episodes continuing there from their newest checkpoints (0: a dead worker
            stops the run, and ``--resume`` continues it).
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
        spawn: Callable[..., Awaitable[Worker]] = spawn_worker,
        env_servers: EnvServers | None = None,
        restarts: int = 0,
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
        self.tracer, self.spawn = tracer, spawn
        self.env_servers = env_servers
        self.restarts_left = restarts
        """Dead workers still to be started again (0: a dead worker stops the run)."""
        self.worker_restarts = 0
        self._sent: dict[int, tuple[Any, ...]] = {}
        self._latest: dict[str, PartialRow] = {}
        self.live: dict[str, EpisodeProgress] = {}
        self._workers: list[Worker] = []
        self._keys = itertools.count()
        self._results: dict[int, asyncio.Future[list[Trajectory]]] = {}
        self._generations: dict[tuple[int, int], asyncio.Task[None]] = {}
        self._prompts = PromptsReceived()
        self._parked: dict[str, Parked] = {}
        self._parked_changed = asyncio.Condition()
        self._sampling: dict[bytes, Any] = {}
        self._background = BackgroundTasks(
            "the rollout workers", error=reader_failed, on_failure=self._fail
        )
        """The pipes' readers and the generations asked for: a failure (a worker that
        died) is raised at the next dispatch, the next wait and close."""
        self._closing = False
        self.worker_cpu_s = 0.0
        """After :meth:`close`: the CPU seconds the workers spent after they started."""
        self.admission = _Gate(self)
        self.admission.set()

    # -- lifecycle

    async def __aenter__(self) -> WorkerRunner:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.close()
        except InfraError:
            if exc[1] is None:  # else the failure is already on its way out
                raise

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
        except BaseException as e:
            await self.__aexit__(type(e), e, e.__traceback__)
            raise

    async def _spawn(self, index: int) -> None:
        spec = WorkerSpec(
            index,
            self.tokenizer,
            self.config,
            self.model,
            self.imports,
            tuple(sys.path),
            self.client.max_model_len,
            self.client.version,
            self.env_servers,
        )
        worker = await self.spawn(spec, self.config.worker_event_loop, self._workers)
        worker.reader = self._background.start(self._read(worker), name=f"rollout-worker-{index}")

    async def close(self) -> None:
        """Stop the workers (their running episodes are cancelled there) and wait for them.

        Raises:
            InfraError: a worker died, or reading its messages failed.
        """
        self._closing = True
        for w in self._workers:
            w.channel.send(("stop",))
        try:
            for w in self._workers:
                try:
                    async with asyncio.timeout(30):
                        await w.process.wait()
                except TimeoutError:
                    logger.warning("rollout worker %d did not stop in 30 s; killing it", w.index)
                    with contextlib.suppress(ProcessLookupError):
                        w.process.kill()
                    await w.process.wait()
            for task in self._generations.values():
                task.cancel()
            # the readers read what is left, up to the end of each pipe
            await self._background.close(timeout_s=5)
        finally:
            for w in self._workers:
                w.channel.close()
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
            ("resume", partial, self.client.version),
            partial.episode_id,
            partial.task.env_id,
            partial.started_version,
        )

    async def _dispatch(
        self, what: tuple[Any, ...], episode_id: str, env_id: str, version: int
    ) -> list[Trajectory]:
        self._background.check()
        if not self._workers:
            raise InfraError("the rollout workers are not running (use `async with`)")
        if episode_id in self.live:
            raise ValueError(f"episode {episode_id!r} is already running")
        worker = min(self._workers, key=lambda w: len(w.running))
        key = next(self._keys)
        future: asyncio.Future[list[Trajectory]] = asyncio.get_running_loop().create_future()
        self._results[key] = future
        worker.running[key] = episode_id
        if self.restarts_left > 0:  # what a restarted worker would start it from
            self._sent[key] = what
        progress = self.live[episode_id] = EpisodeProgress(
            episode_id, env_id, started_version=version
        )
        if self.tracer is not None and self.tracer.enabled:
            progress.trace = EpisodeTrace(self.tracer, episode_id, ROLLOUT)
            progress.set_phase(progress.phase)
        worker.channel.send((what[0], key, *what[1:]))
        try:
            return await future
        except asyncio.CancelledError:
            holder = self._holder(key)  # another worker than ``worker`` after a restart
            if holder is not None:
                holder.channel.send(("cancel", key))
            raise
        finally:
            self._results.pop(key, None)
            self._sent.pop(key, None)
            self._latest.pop(episode_id, None)
            holder = self._holder(key)
            if holder is not None:
                holder.running.pop(key, None)
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
                    self._background.failure is not None
                    or all(e in self._parked or e not in self.live for e in episode_ids)
                )
            )
        self._background.check()

    def retarget(self, targets: Sequence[Target]) -> None:
        """The env servers (``env_servers.targets``) run at ``targets`` now: every worker
        re-aims its relays (a worker started later gets them in its spec)."""
        if self.env_servers is None or self.env_servers.targets is None:
            raise ValueError("retarget: this runner's env servers do not move (no targets)")
        self.env_servers = dataclasses.replace(self.env_servers, targets=tuple(targets))
        for w in self._workers:
            w.channel.send(("env_targets", self.env_servers.targets))

    # -- internals

    def _workers_by_index(self) -> dict[int, Worker]:
        return {w.index: w for w in self._workers}

    def _holder(self, key: int) -> Worker | None:
        """The worker running dispatch ``key`` now."""
        return next((w for w in self._workers if key in w.running), None)

    def _gate_changed(self, is_open: bool) -> None:
        self._parked.clear()
        epoch = self.admission.epoch
        for w in self._workers:
            w.channel.send(("gate", is_open, epoch, self.client.version))


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
    env: EnvConfig | None = None,
    env_targets: Sequence[Target] | None = None,
    spawn: Callable[..., Awaitable[Worker]] = spawn_worker,
    restarts: int = 0,
) -> Runner:
    """The runner of a run: an :class:`EpisodeRunner` when ``config.workers`` is 1, else a
    started :class:`WorkerRunner` (closed by ``stack``).

    ``make`` builds the envs in this process (one runner); with several workers, envs on
    env servers (``env.url``/``urls``) are reached by each worker through its own pool of
    them (``env_targets``: where servers that may move run now, see
    :class:`~agentrl.rollout.wire.EnvServers`).

    Raises:
        ConfigError: ``rollout.workers > 1`` with a ``make`` that is not the env servers'.
    """
    from agentrl.chat.formats import resolve_chat_format

    if config.workers == 1:
        extra = {"make": make} if make is not None else {}
        return EpisodeRunner(
            client,
            tokenizer,
            config,
            metrics=metrics,
            checkpoint=checkpoint,
            tracer=tracer,
            chat=resolve_chat_format(tokenizer, model),
            **extra,
        )
    servers = None
    if env is not None and env.remote:
        targets = tuple(env_targets) if env_targets is not None else None
        servers = EnvServers(env, targets)
    elif make is not None:
        raise ConfigError(
            f"rollout.workers = {config.workers} with envs made in this process only (a "
            "`make` of the caller's): worker processes cannot use it; serve the envs (env.url/"
            "urls, or cluster.env_servers) or set rollout.workers = 1"
        )
    runner = WorkerRunner(
        client,
        tokenizer,
        config,
        metrics=metrics,
        checkpoint=checkpoint,
        model=model,
        imports=imports,
        tracer=tracer,
        spawn=spawn,
        env_servers=servers,
        restarts=restarts,
    )
    return await stack.enter_async_context(runner)
