"""``Scheduler``: many episodes at once, in groups, with staleness-bounded admission.

Each task runs as a group of ``group_size`` episodes with the same env and seed (for
group-relative advantages); at most ``concurrency`` episodes run at once. Each group
is a task of the run's ``asyncio.TaskGroup`` and runs its episodes in a TaskGroup of
its own, so an infrastructure error in one episode cancels its siblings and stops the
run. A group is queued only when every episode in it has ended.

Admission control (off when ``max_staleness`` or ``batch_size`` is None). With ``B``
trajectories per optimizer step (``batch_size``) and the trainer at version ``v``, a new
group of ``G`` episodes is admitted only if

    started + G <= (v + max_staleness + 1) * B

where ``started`` counts every episode admitted since the run began (retries are not
new episodes). The rule and why it bounds staleness live in
:class:`~agentrl.rollout.staleness.Staleness`.

Failures: an episode that fails (env exception, env timeout) is retried with a fresh
env up to ``max_retries`` times; its failed attempts are kept in ``failed_attempts``
with their reasons. An episode discarded by a weight update (``drop`` policy) runs
again without using up a retry. An infrastructure error stops the whole run.

Durability (with a :class:`~agentrl.store.StoreWriter`): each task is recorded when
admitted, each episode when it starts and when it ends, and a group is queued only
after it is durably marked complete. With ``resume=True`` every task first consults
the store: episodes that already ended are taken from it, checkpointed ones continue
from their checkpoint, and only the rest run from the start.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from typing import Any

from agentrl.config import RolloutConfig
from agentrl.errors import ConfigError
from agentrl.queue import TrajectoryQueue
from agentrl.rollout.base import Runner
from agentrl.rollout.episode import EpisodeDropped
from agentrl.rollout.staleness import Staleness
from agentrl.runtime.metrics import Metrics
from agentrl.store import StoreWriter
from agentrl.types import Group, PartialEpisode, Task, Trajectory


class Scheduler:
    """Runs tasks as groups of episodes and puts complete groups into a queue.

    Implements :class:`~agentrl.protocols.RolloutSource`, what the training loop drives.

    Args:
        runner: runs one episode.
        queue: where complete groups go (``put`` blocks when it is full).
        config: concurrency, group size, retries, staleness bound (``[rollout]``).
        batch_size: trajectories per optimizer step; with it, admission keeps every
            episode within ``config.max_staleness`` versions of the trainer. None (no
            trainer consumes the groups): no staleness bound.
        version: the trainer's current version (for admission); defaults to the
            engine's version.
        on_group: called with each complete group before it is queued.
    """

    def __init__(
        self,
        runner: Runner,
        queue: TrajectoryQueue,
        config: RolloutConfig | None = None,
        *,
        batch_size: int | None = None,
        version: Callable[[], int] | None = None,
        metrics: Metrics | None = None,
        on_group: Callable[[Group], Any] | None = None,
        writer: StoreWriter | None = None,
        resume: bool = False,
    ) -> None:
        self.runner = runner
        self.queue = queue
        self.config = config or RolloutConfig()
        if batch_size is not None and batch_size < self.config.group_size:
            raise ConfigError(
                f"batch_size ({batch_size}) must be at least rollout.group_size "
                f"({self.config.group_size}), or no group could ever be admitted"
            )
        self.batch_size = batch_size
        self.staleness = Staleness(self.config.max_staleness)
        self.version = version or (lambda: runner.client.version)
        self.metrics = metrics or runner.metrics
        self.on_group = on_group
        self.writer = writer
        self.resume = resume
        if resume and writer is None:
            raise ConfigError("resuming needs the run's episode store (a StoreWriter)")
        self.slots = asyncio.Semaphore(self.config.concurrency)
        self.started = 0
        self.in_flight = 0
        self.groups_done = 0
        self.failed_attempts: list[Trajectory] = []
        self._capacity = asyncio.Condition()
        self._stopping = False

    def capacity_left(self) -> int | None:
        """Episodes that may still be admitted at the current version (None: unbounded)."""
        return self.staleness.capacity(self.version(), self.batch_size, self.started)

    def generation_idle(self) -> bool:
        """Whether no episode is being generated (the staleness bound or a full queue
        holds admission, or there is nothing left to run)."""
        return self.in_flight == 0

    async def notify_version(self) -> None:
        """Call after the trainer publishes a version: admission may open up."""
        async with self._capacity:
            self._capacity.notify_all()

    def stop(self) -> None:
        """Admit nothing more; running groups finish (use task cancellation to abort)."""
        self._stopping = True

    async def run(self, tasks: Iterable[Task] | AsyncIterable[Task]) -> None:
        """Run every task (until ``stop``); return when every admitted group is queued."""
        async with asyncio.TaskGroup() as tg:
            async for task in _aiter(tasks):
                if self._stopping:
                    break
                admitted_at = await self._admit()
                if self._stopping:
                    break
                if self.writer is not None:  # recorded in admission order
                    self.writer.task(task, self.config.group_size)
                self.queue.expect(admitted_at)  # a step due then waits for this group
                tg.create_task(self._run_group(task, admitted_at), name=f"group-{task.task_id}")
                # Let the loop turn between admissions: with free slots nothing above
                # waits, and admitting a thousand groups in one go (their episodes then
                # start their envs, each in a thread of its own, all in the next turn)
                # held the event loop for about a second (bench_ceiling's loop lag).
                await asyncio.sleep(0)

    async def _admit(self) -> int:
        """Wait for room, count the group as started; the trainer's version then."""
        size = self.config.group_size
        async with self._capacity:

            def admissible() -> bool:
                left = self.capacity_left()
                return self._stopping or left is None or left >= size

            await self._capacity.wait_for(admissible)
            version = self.version()
            if self._stopping:
                return version
            self.started += size
        for _ in range(size):  # a slot per episode; each episode frees its own
            await self.slots.acquire()
        return version

    async def _run_group(self, task: Task, admitted_at: int) -> None:
        queued = False
        try:
            await self._run_episodes(task, admitted_at)
            queued = True
        finally:
            if not queued:  # cancelled or failed: a step waiting for it must not hang
                self.queue.withdraw(admitted_at)

    async def _run_episodes(self, task: Task, admitted_at: int) -> None:
        size = self.config.group_size
        ended: dict[str, list[Trajectory]] = {}
        partials: dict[str, PartialEpisode] = {}
        attempts: dict[str, int] = {}
        if self.writer is not None and self.resume:
            ended, partials, attempts = await asyncio.to_thread(self._stored, task, size)
        # A TaskGroup, not gather: an InfraError in one episode cancels its siblings
        # (gather would leave them running after the error left this group).
        async with asyncio.TaskGroup() as tg:
            episodes = [
                tg.create_task(
                    self._run_episode(
                        task, i, ended, partials.get(f"{task.task_id}/{i}"), attempts
                    ),
                    name=f"episode-{task.task_id}/{i}",
                )
                for i in range(size)
            ]
        group = Group(
            task,
            size,
            [t for episode in episodes for t in episode.result()],
            admitted_at=admitted_at,
        )
        self.groups_done += 1
        self.metrics.count("groups_done")
        if self.writer is not None:
            self.writer.group(group)
            await self.writer.flush()  # durable before anyone can train on it
        if self.on_group is not None:
            self.on_group(group)
        await self.queue.put(group)

    def _stored(
        self, task: Task, size: int
    ) -> tuple[dict[str, list[Trajectory]], dict[str, PartialEpisode], dict[str, int]]:
        store = self.writer.store  # type: ignore[union-attr]
        try:
            stored_size = store.group_size(task.task_id)
        except KeyError:  # a new task (its record is on its way through the writer)
            stored_size = size
        if stored_size != size:
            raise ConfigError(
                f"task {task.task_id!r} was stored with group size {stored_size}, but this "
                f"run uses {size}"
            )
        ended = store.ended_episodes(task.task_id)
        ids = [f"{task.task_id}/{i}" for i in range(size)]
        partials = {e: p for e in ids if (p := store.partial(e)) is not None}
        return ended, partials, {e: store.next_attempt(e) for e in ids}

    async def _run_episode(
        self,
        task: Task,
        index: int,
        ended: dict[str, list[Trajectory]],
        partial: PartialEpisode | None,
        attempts: dict[str, int],
    ) -> list[Trajectory]:
        episode_id = f"{task.task_id}/{index}"
        try:
            if episode_id in ended:
                self.metrics.count("episodes_from_store")
                return ended[episode_id]
            self.in_flight += 1
            try:
                return await self._attempts(task, episode_id, partial, attempts.get(episode_id, 0))
            finally:
                self.in_flight -= 1
        finally:
            self.slots.release()

    async def _attempts(
        self, task: Task, episode_id: str, partial: PartialEpisode | None, attempt: int
    ) -> list[Trajectory]:
        failures = 0
        if partial is not None:
            attempt = partial.attempt
        while True:
            try:
                if partial is not None:
                    trajectories = await self.runner.resume(partial)
                else:
                    if self.writer is not None:
                        self.writer.started(episode_id, task, attempt, self.runner.client.version)
                    trajectories = await self.runner.run(task, episode_id, attempt)
            except EpisodeDropped as e:
                self.metrics.count("episodes_dropped")
                if self.writer is not None:
                    self.writer.dropped(episode_id, attempt, e.reason)
                partial, attempt = None, attempt + 1
                continue
            partial = None
            failed = trajectories[-1].status == "failed"
            retry = failed and failures < self.config.max_retries
            if self.writer is not None:
                self.writer.episode(trajectories, retried=retry)
            if not retry:
                return trajectories
            self.failed_attempts.extend(trajectories)
            self.metrics.count("episode_retries")
            failures += 1
            attempt += 1

    def resume_admitted(self, count: int) -> None:
        """On resume: count ``count`` episodes as admitted before the restart.

        Admission then goes on from where the killed run stood: the trainer restored at
        version ``v`` had consumed ``v * batch_size`` trajectories, so the staleness
        bound (:meth:`capacity_left`) counts from there, not from zero.
        """
        if count < 0:
            raise ValueError(f"count of admitted episodes is {count}; it must be >= 0")
        self.started = count


async def _aiter(tasks: Iterable[Task] | AsyncIterable[Task]) -> AsyncIterator[Task]:
    if isinstance(tasks, AsyncIterable):
        async for task in tasks:
            yield task
    else:
        for task in tasks:
            yield task


def tasks_for(
    env_id: str, count: int | None, *, first_seed: int = 0, **env_kwargs: Any
) -> Iterator[Task]:
    """Tasks ``env_id`` with seeds first_seed, first_seed + 1, ... (forever if count is None)."""
    seeds = itertools.count(first_seed) if count is None else range(first_seed, first_seed + count)
    for seed in seeds:
        yield Task(f"{env_id.replace('/', '.')}#{seed}", env_id, seed, env_kwargs=env_kwargs)
