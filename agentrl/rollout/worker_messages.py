"""The main process's side of the rollout workers' wire: each worker's pipe read, its
generation requests answered from the engine, its checkpoints, parked episodes and ends
handed on, its metrics merged.

:class:`WorkerMessages` is a part of :class:`~agentrl.rollout.workers.WorkerRunner`
(its base class): the runner owns the state these methods read and change.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import pickle
from collections.abc import Awaitable, Callable
from typing import Any

from agentrl.errors import InfraError
from agentrl.rollout.episode import EpisodeProgress
from agentrl.rollout.wire import PromptsReceived, error_from, error_payload, generation_values
from agentrl.rollout.worker_spawn import Worker
from agentrl.runtime.background import BackgroundTasks
from agentrl.runtime.metrics import Metrics
from agentrl.store.schema import PartialRow, encoded
from agentrl.types import PartialEpisode, Trajectory

logger = logging.getLogger(__name__)


def reader_failed(failure: BaseException) -> BaseException:
    """A failure of the workers as the run sees it: an InfraError that says what next."""
    if isinstance(failure, InfraError):
        return failure
    return InfraError(
        f"reading the rollout workers' messages failed ({type(failure).__name__}: {failure}; "
        "the traceback is in the log); the run stops here (unfinished episodes resume from "
        "their checkpoints with --resume)"
    )


@dataclasses.dataclass
class Parked:
    """An episode a worker parked for a weight update: its worker, checkpoint, oldest
    version, prefix tokens and sampled tokens."""

    worker: int
    snapshot: PartialEpisode | None
    oldest: int | None
    prefix: int
    sampled: int


class WorkerMessages:
    """The workers' messages read and answered; a base of ``WorkerRunner``, which sets
    these attributes."""

    client: Any
    metrics: Metrics
    checkpoint: Callable[[PartialEpisode], Any] | None
    live: dict[str, EpisodeProgress]
    admission: Any
    _workers: list[Worker]
    _results: dict[int, asyncio.Future[list[Trajectory]]]
    _generations: dict[tuple[int, int], asyncio.Task[None]]
    _prompts: PromptsReceived
    _parked: dict[str, Parked]
    _parked_changed: asyncio.Condition
    _sampling: dict[bytes, Any]
    _background: BackgroundTasks
    _closing: bool
    _sent: dict[int, tuple[Any, ...]]
    """What each running episode was dispatched with (by key): a restarted worker
    starts it again from there when it has no checkpoint yet."""
    _latest: dict[str, PartialRow]
    """Each running episode's newest per-turn checkpoint (by episode id)."""
    restarts_left: int
    worker_restarts: int
    _spawn: Callable[[int], Awaitable[None]]
    _workers_by_index: Callable[[], dict[int, Worker]]

    def _episode_of(self, key: int) -> str:
        for w in self._workers:
            if key in w.running:
                return w.running[key]
        return ""

    async def _notify_parked(self) -> None:
        async with self._parked_changed:
            self._parked_changed.notify_all()

    async def _read(self, worker: Worker) -> None:
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
        if self._closing:
            return
        if self.restarts_left > 0:
            await self._restart(worker, code)
            return
        self._background.fail(
            InfraError(
                f"rollout worker {worker.index} (pid {worker.process.pid}) died with exit code "
                f"{code}; the run stops here (groups already completed were handed on and are "
                "kept; unfinished episodes resume from their checkpoints with --resume)"
            )
        )

    async def _restart(self, dead: Worker, code: int | str) -> None:
        """Start worker ``dead.index`` again and continue its episodes there, each from
        its newest checkpoint (its parked snapshot, its last per-turn checkpoint, or what
        it was dispatched with): the scheduler's futures never see the death."""
        self.restarts_left -= 1
        self.worker_restarts += 1
        self.metrics.count("rollout_worker_restarts")
        running = dict(dead.running)
        logger.warning(
            "rollout worker %d (pid %s) died with exit code %s; starting it again (%d restart(s) "
            "left); its %d episode(s) continue from their checkpoints",
            dead.index,
            dead.process.pid,
            code,
            self.restarts_left,
            len(running),
        )
        self._workers.remove(dead)
        dead.channel.close()
        for (index, n), task in list(self._generations.items()):
            if index == dead.index:  # nobody waits for these answers any more
                task.cancel()
                self._generations.pop((index, n), None)
        await self._spawn(dead.index)
        worker = self._workers_by_index()[dead.index]
        worker.channel.send(
            ("gate", self.admission.is_set(), self.admission.epoch, self.client.version)
        )
        for key, episode_id in running.items():
            if key not in self._results:  # ended meanwhile (cancelled)
                continue
            self._prompts.forget((dead.index, episode_id))
            worker.running[key] = episode_id
            worker.channel.send(self._continuation(key, episode_id))

    def _continuation(self, key: int, episode_id: str) -> tuple[Any, ...]:
        """How episode ``episode_id`` (dispatch ``key``) continues on a new worker."""
        parked = self._parked.pop(episode_id, None)
        latest = self._latest.get(episode_id)
        if parked is not None and parked.snapshot is not None:
            partial: PartialEpisode | None = parked.snapshot
        else:
            partial = latest.decoded() if latest is not None else None
        sent = self._sent[key]
        if partial is None:
            return (sent[0], key, *sent[1:])  # no checkpoint yet: as it was dispatched
        progress = self.live.get(episode_id)
        if progress is not None:
            progress.set_phase("env")
        return ("resume", key, partial, self.client.version)

    def _fail(self, failure: BaseException) -> None:
        """The first failure: every episode waiting on a worker fails with it."""
        error = reader_failed(failure)
        for future in self._results.values():
            if not future.done():
                future.set_exception(error)
        self._background.start(self._notify_parked(), name="rollout-workers-failed")

    def _handle(self, worker: Worker, message: tuple[Any, ...]) -> None:
        what = message[0]
        if what == "gen":
            _, n, payload, sampling, request_id, episode_id, turn, tool_calls = message
            try:
                prompt = self._prompts.prompt((worker.index, episode_id), n, payload)
            except InfraError as e:  # the episode fails with it; the run stops
                worker.channel.send(("gen", n, error_payload(e), self.client.version))
                return
            progress = self.live.get(episode_id)
            if progress is not None:
                progress.turn, progress.tool_calls = turn, tool_calls
                progress.set_phase("engine")
            self._generations[(worker.index, n)] = self._background.start(
                self._generate(worker, n, prompt, sampling, request_id, progress),
                name=f"generate-{request_id}",
            )
        elif what == "ungen":
            task = self._generations.pop((worker.index, message[1]), None)
            if task is not None:
                task.cancel()
        elif what == "stopped":
            worker.cpu_s += message[1]
        elif what == "partial":
            row = message[1]
            if self.restarts_left > 0 and row.episode_id in self.live:  # for a restart
                self._latest[row.episode_id] = row
            if self.checkpoint is not None:
                self.checkpoint(row)
        elif what == "parked":
            _, episode_id, epoch, snapshot, oldest, prefix, sampled = message
            if not self.admission.is_set() and epoch == self.admission.epoch:
                self._parked[episode_id] = Parked(worker.index, snapshot, oldest, prefix, sampled)
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
                    error_from(message[2], f"rollout worker {worker.index}", episode_id)
                )
            else:
                future.cancel()

    async def _generate(
        self,
        worker: Worker,
        n: int,
        prompt: list[int],
        sampling: bytes,
        request_id: str,
        progress: EpisodeProgress | None,
    ) -> None:
        try:
            if not self.admission.is_set():  # sent before the worker saw the gate close
                await self.admission.wait()
            params = self._sampling.get(sampling)
            if params is None:
                params = self._sampling[sampling] = pickle.loads(sampling)
            gen = await self.client.generate(prompt, params, request_id)
            result: tuple[Any, ...] = (None, *generation_values(gen))
            if progress is not None:
                progress.add_tokens(gen.versions)
                progress.set_phase("env")
        except Exception as e:  # carried to the worker's episode (a cancellation goes on)
            result = error_payload(e)
        finally:
            self._generations.pop((worker.index, n), None)
        worker.channel.send(("gen", n, result, self.client.version))

    def _merge(
        self, metrics: tuple[dict[str, float], dict[str, float], dict[str, list[float]]]
    ) -> None:
        counters, gauges, samples = metrics
        self.metrics.counters.update(counters)
        self.metrics.gauges.update(gauges)
        for name, values in samples.items():
            self.metrics.samples[name].extend(values)
