"""``StoreWriter``: batched writes to the episode store, off the event loop.

Owns the queue of writes the rollout side submits without waiting (tasks, episode
starts, checkpoints, ended and dropped episodes, complete groups, weight versions), the
background task that commits them in one transaction per batch, and what happens when a
commit fails: the writes stay queued, in order, and the error reaches the writer's
owner. The rows themselves are written by :class:`~agentrl.store.EpisodeStore`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

from agentrl.runtime import faults
from agentrl.runtime.background import BackgroundTasks
from agentrl.store.episodes import EpisodeStore
from agentrl.store.schema import PartialRow
from agentrl.types import Group, PartialEpisode, Task, Trajectory

logger = logging.getLogger(__name__)

_op = dataclasses.dataclass(frozen=True, slots=True)


@_op
class AddTask:
    """A task to run ``group_size`` times (:meth:`StoreWriter.task`)."""

    task: Task
    group_size: int


@_op
class Started:
    """An episode's attempt began (:meth:`StoreWriter.started`)."""

    episode_id: str
    task: Task
    attempt: int
    version: int


@_op
class Checkpoint:
    """An episode's state after a turn (:meth:`StoreWriter.partial`)."""

    partial: PartialEpisode | PartialRow


@_op
class Ended:
    """An episode's trajectories (:meth:`StoreWriter.episode`)."""

    trajectories: list[Trajectory]
    retried: bool


@_op
class Dropped:
    """An episode's attempt failed for good (:meth:`StoreWriter.dropped`)."""

    episode_id: str
    attempt: int
    reason: str


@_op
class GroupDone:
    """A group complete, ready to train on (:meth:`StoreWriter.group`)."""

    group: Group


@_op
class Version:
    """A weight version published (:meth:`StoreWriter.version`)."""

    version: int
    kind: str
    source: str
    stats: dict[str, Any]


@_op
class Superseded:
    """A pending checkpoint that an end or drop of its episode made moot: nothing to write."""


Op = AddTask | Started | Checkpoint | Ended | Dropped | GroupDone | Version | Superseded


class StoreWriter:
    """Writes to the store off the event loop, batched: one transaction per batch.

    Components submit writes without waiting (``task``, ``started``, ``partial``,
    ``episode``, ``dropped``, ``group``, ``version``); a background task commits
    whatever is pending every ``interval_s``; :meth:`flush` commits now and returns once
    it is durable. Writes are applied in the order they were submitted, except that a
    newer checkpoint of an episode replaces an older one still pending, and an episode's
    end (or drop) cancels its checkpoint still pending (the end deletes it anyway).

    A write leaves the queue only once its transaction has committed. When a commit
    fails, :meth:`flush` raises the error and every write stays pending, in order, for
    the next flush. When a background commit fails, the background task stops and the
    writer is failed: every later call (a submit, :meth:`flush`, leaving the ``async
    with``) raises that error, so the run stops with it instead of going on unrecorded.

    Use as ``async with StoreWriter(store) as writer:``; leaving flushes.
    """

    def __init__(
        self, store: EpisodeStore, *, interval_s: float = 0.2, metrics: Any = None
    ) -> None:
        self.store = store
        self.interval_s = interval_s
        self.metrics = metrics
        self._ops: list[Op] = []
        self._partial_at: dict[str, int] = {}  # episode id -> index of its pending checkpoint
        self._writing = 0  # _ops[:_writing] are in the transaction being committed
        # the background commits; their failure (kept as is) is raised at every later call
        self._background = BackgroundTasks("the store writer")
        self._flush_lock: asyncio.Lock | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None

    async def __aenter__(self) -> StoreWriter:
        self._flush_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task = self._background.start(self._run(), name="store-writer")
        return self

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self._task = None
        try:
            await self._background.close()  # a cancellation of ours propagates from here
        except Exception as e:
            if e is not self._background.failure:
                raise
        failure = self._background.failure
        if failure is not None and _carries(exc, failure):
            return  # the background failure is already on its way out
        await self.flush()

    @property
    def pending(self) -> int:
        """Writes submitted and not yet committed (those being committed included)."""
        return len(self._ops)

    # -- submitting ------------------------------------------------------------------------

    def task(self, task: Task, group_size: int) -> None:
        self._submit(AddTask(task, group_size))

    def started(self, episode_id: str, task: Task, attempt: int, version: int) -> None:
        self._submit(Started(episode_id, task, attempt, version))

    def partial(self, partial: PartialEpisode | PartialRow) -> None:
        self._raise_failure()
        at = self._partial_at.get(partial.episode_id)
        if at is None or at < self._writing:  # none pending, or it is being committed now
            at = self._partial_at[partial.episode_id] = len(self._ops)
        self._put(at, Checkpoint(partial))

    def episode(self, trajectories: Sequence[Trajectory], *, retried: bool = False) -> None:
        self._submit(Ended(list(trajectories), retried))
        self._supersede(trajectories[0].episode_id)

    def dropped(self, episode_id: str, attempt: int, reason: str) -> None:
        self._submit(Dropped(episode_id, attempt, reason))
        self._supersede(episode_id)

    def _supersede(self, episode_id: str) -> None:
        """An ended or dropped episode's pending checkpoint is not written: the end (in
        the same transaction, as every pending write is) deletes it anyway. One being
        committed now is left alone."""
        at = self._partial_at.pop(episode_id, None)
        if at is not None and at >= self._writing:
            self._ops[at] = Superseded()

    def group(self, group: Group) -> None:
        self._submit(GroupDone(group))

    def version(self, version: int, kind: str, source: str, stats: dict[str, Any]) -> None:
        self._submit(Version(version, kind, source, stats))

    def _submit(self, op: Op) -> None:
        self._raise_failure()
        self._put(len(self._ops), op)

    def _put(self, at: int, op: Op) -> None:
        """Append ``op`` (``at`` is the end) or replace the pending op at ``at``."""
        if at == len(self._ops):
            self._ops.append(op)
        else:
            self._ops[at] = op
        if self._wake is not None:
            self._wake.set()

    def _raise_failure(self) -> None:
        self._background.check()

    # -- committing ------------------------------------------------------------------------

    async def flush(self) -> None:
        """Commit everything submitted so far; return when it is on disk.

        Raises:
            StoreError: the commit failed (nothing was dropped: the writes stay pending,
                in order), or an earlier background commit did (the writer is failed).
        """
        self._raise_failure()
        write = asyncio.create_task(self._write_pending(), name="store-writer-flush")
        try:
            await asyncio.shield(write)
        except asyncio.CancelledError:
            # A transaction cannot be stopped half-way: it finishes on its own (holding
            # the lock, so no later flush writes its ops again) and a failure of it
            # reaches the owner at the next call.
            write.add_done_callback(self._orphan_done)
            raise

    async def _write_pending(self) -> None:
        if self._flush_lock is None:  # flushed without `async with`
            self._flush_lock = asyncio.Lock()
        async with self._flush_lock:
            n = len(self._ops)
            if not n:
                return
            self._writing = n
            t0 = time.perf_counter()
            try:
                await asyncio.to_thread(self._apply, self._ops[:n])
            finally:
                self._writing = 0
            self._committed(n)
            if self.metrics is not None:
                self.metrics.observe("store_batch_write_s", time.perf_counter() - t0)
                self.metrics.count("store_writes", n)

    def _committed(self, n: int) -> None:
        """Drop the first ``n`` ops, now durable; ops submitted meanwhile stay."""
        del self._ops[:n]
        self._partial_at = {eid: i - n for eid, i in self._partial_at.items() if i >= n}

    def _orphan_done(self, write: asyncio.Task[None]) -> None:
        """Keep the failure of a commit whose flush was cancelled, for the next call."""
        error = None if write.cancelled() else write.exception()
        if error is not None:
            logger.error("writing the episode store failed; the run stops: %s", error)
            self._background.fail(error)

    def _apply(self, ops: list[Op]) -> None:
        """Write ``ops`` in one transaction, each kind's consecutive writes together.

        A batch is cut into runs: checkpoints (``partial``), and episode lifecycles (the
        ``task``, ``started``, ``episode`` end and ``group`` ops between two checkpoints
        or other writes). A run of checkpoints is one statement run for all of them
        (``executemany``); a lifecycle run writes its tasks, then its starts, then its
        ends, then its completed groups, each kind as one statement run. That order
        keeps what the order of submission guarantees: an episode's task was submitted
        before its start, its start before its end, a group's ends before the group, and
        these kinds touch no row of one another's otherwise. A checkpoint stays between
        the ends submitted before it and after it (an end deletes its episode's
        checkpoint), and ``dropped`` and ``version`` writes stay where they were.
        """
        store = self.store
        partials: list[PartialEpisode | PartialRow] = []
        tasks: list[tuple[Task, int]] = []
        starts: list[tuple[str, Task, int, int]] = []
        ends: list[tuple[list[Trajectory], bool]] = []
        groups: list[Group] = []

        def write_partials() -> None:
            if partials:
                store.save_partials(partials)
                partials.clear()

        # In this order (see above): tasks, starts, ends, groups.
        lifecycle_writes: list[tuple[list[Any], Any]] = [
            (tasks, store.add_sized_tasks),
            (starts, store.episodes_started),
            (ends, store.save_episodes),
            (groups, store.complete_groups),
        ]

        def write_lifecycles() -> None:
            for pending, write in lifecycle_writes:
                if pending:
                    write(pending)
                    pending.clear()

        with store.batch():
            for i, op in enumerate(ops):
                if i == 1:
                    faults.point("store_write")
                if isinstance(op, Checkpoint):
                    write_lifecycles()
                    partials.append(op.partial)
                    continue
                if isinstance(op, Superseded):
                    continue
                write_partials()
                match op:
                    case AddTask():
                        tasks.append((op.task, op.group_size))
                    case Started():
                        starts.append((op.episode_id, op.task, op.attempt, op.version))
                    case Ended():
                        ends.append((op.trajectories, op.retried))
                    case GroupDone():
                        groups.append(op.group)
                    case Dropped():
                        write_lifecycles()
                        store.drop_episode(op.episode_id, op.attempt, op.reason)
                    case Version():
                        write_lifecycles()
                        store.record_version(op.version, op.kind, op.source, op.stats)
                    case _:
                        raise TypeError(f"not a store write: {op!r}")
            write_partials()
            write_lifecycles()

    async def _run(self) -> None:
        """Commit what is pending, each ``interval_s`` after a submit. A failed commit
        ends the task: :class:`BackgroundTasks` logs it and fails the writer with it."""
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(self.interval_s)
            await self.flush()


def _carries(exc: BaseException | None, error: BaseException) -> bool:
    """Whether ``exc`` is ``error`` or holds it (a task group's exception group)."""
    if exc is error:
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(_carries(e, error) for e in exc.exceptions)
    return False
