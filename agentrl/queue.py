"""``TrajectoryQueue``: complete groups from the rollout side to the trainer.

Bounded in groups: ``put`` blocks while the queue is full, so rollouts slow down to
the trainer's pace instead of piling up memory. Groups are handed over by reference
(no copy, no second buffer), in order. Nothing here drops groups.

Staleness (:class:`~agentrl.rollout.staleness.Staleness`) is bounded in two halves.
Admission caps how many episodes are out at once; the queue makes sure no group is
trained late. Groups end out of admission order (a long episode, a retry, a pause for a
weight update), so taking the oldest *ended* groups could leave a group admitted long
ago for a later step, its first tokens more than ``max_staleness`` versions old. The
scheduler therefore announces each admitted group (:meth:`expect`), and
``get_batch(n, due=v)`` waits until every announced group admitted at version ``v`` or
before has arrived, then hands out the groups admitted first. A due group is let in
even when the queue is full, so the wait cannot deadlock. With ``max_staleness = 1``
admission leaves at most a batch due at once; with a larger bound an unlucky order can
leave more, and then the step takes the oldest batch and the rest lead the next one.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence

from agentrl.runtime.background import BackgroundTasks
from agentrl.types import Group


class QueueClosed(Exception):
    """The queue was closed and is empty."""


class TrajectoryQueue:
    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1 group, got {maxsize}")
        self.maxsize = maxsize
        self._groups: collections.deque[Group] = collections.deque()
        self._changed = asyncio.Condition()
        self._background = BackgroundTasks("the trajectory queue")
        self._closed = False
        self.high_water = 0
        self.put_total = 0
        self.got_total = 0
        self._expected: collections.Counter[int] = collections.Counter()
        self._due: int | None = None  # what the waiting get_batch needs

    def __len__(self) -> int:
        return len(self._groups)

    @property
    def closed(self) -> bool:
        return self._closed

    async def put(self, group: Group) -> None:
        """Add a complete group; wait while the queue is full."""
        if not group.complete:
            raise ValueError(
                f"group of task {group.task.task_id!r} has {len(group.episodes)} of "
                f"{group.size} episodes; only complete groups are queued"
            )
        async with self._changed:
            await self._changed.wait_for(
                lambda: len(self._groups) < self.maxsize or self._closed or self._is_due(group)
            )
            if self._closed:
                raise QueueClosed("put() on a closed TrajectoryQueue")
            if group.admitted_at is not None:
                self._settle(group.admitted_at)
            self._groups.append(group)
            self.put_total += 1
            self.high_water = max(self.high_water, len(self._groups))
            self._changed.notify_all()

    async def put_restored(self, groups: Sequence[Group]) -> None:
        """Queue groups completed before a restart, ahead of new ones, without waiting.

        They may be more than ``maxsize`` (a run killed repeatedly leaves complete,
        untrained groups behind each time): the queue holds them all, and new puts wait
        until the trainer has drained it below ``maxsize``.
        """
        async with self._changed:
            if self._closed:
                raise QueueClosed("put_restored() on a closed TrajectoryQueue")
            for group in groups:
                if not group.complete:
                    raise ValueError(f"group of task {group.task.task_id!r} is incomplete")
                self._groups.append(group)
                self.put_total += 1
            self.high_water = max(self.high_water, len(self._groups))
            self._changed.notify_all()

    async def get(self) -> Group:
        """The oldest group; wait while there is none."""
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._groups) or self._closed)
            if not self._groups:
                raise QueueClosed("the TrajectoryQueue is closed and empty")
            group = self._groups.popleft()
            self._changed.notify_all()
            self.got_total += 1
            return group

    def expect(self, admitted_at: int) -> None:
        """Announce a group admitted at trainer version ``admitted_at``: a later
        ``get_batch`` whose ``due`` reaches that version waits for it (the scheduler
        calls this at admission, :meth:`put` or :meth:`withdraw` settles it)."""
        self._expected[admitted_at] += 1

    def withdraw(self, admitted_at: int) -> None:
        """An announced group will not arrive (its run was cancelled or failed)."""
        self._settle(admitted_at)
        if self._due is not None:  # wake the getter waiting for it (in a task: a cancelled
            self._background.start(self._notify(), name="queue-withdrawn")  # task calls this)

    def _settle(self, admitted_at: int) -> None:
        if self._expected[admitted_at] > 1:
            self._expected[admitted_at] -= 1
        else:
            self._expected.pop(admitted_at, None)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def expected_due(self, due: int) -> int:
        """Announced groups admitted at version ``due`` or before, not yet arrived."""
        return sum(c for v, c in self._expected.items() if v <= due)

    def _is_due(self, group: Group) -> bool:
        return (
            self._due is not None
            and group.admitted_at is not None
            and (group.admitted_at <= self._due)
        )

    async def get_batch(self, n: int, due: int | None = None) -> list[Group]:
        """``n`` groups. With ``due``: once every group admitted at version ``due`` or
        before has ended (waited for), the ``n`` admitted first, so the due ones lead;
        without, the ``n`` that ended first."""
        self._background.check()
        if due is None:
            return [await self.get() for _ in range(n)]
        async with self._changed:
            self._due = due
            self._changed.notify_all()  # a full queue now lets due groups in
            try:
                await self._changed.wait_for(
                    lambda: self._closed or (len(self._groups) >= n and not self.expected_due(due))
                )
            finally:
                self._due = None
            if len(self._groups) < n:
                raise QueueClosed("the TrajectoryQueue is closed with fewer groups than a batch")

            def oldest_admitted(item: tuple[int, Group]) -> tuple[int, int]:
                i, group = item  # restored groups (admitted before a restart) first
                return (-1 if group.admitted_at is None else group.admitted_at, i)

            ranked = sorted(enumerate(self._groups), key=oldest_admitted)
            batch = [g for _, g in ranked[:n]]
            self._groups = collections.deque(g for _, g in sorted(ranked[n:]))
            self.got_total += n
            self._changed.notify_all()
            return batch

    async def close(self) -> None:
        """Refuse new puts; getters drain what is left, then get QueueClosed."""
        async with self._changed:
            self._closed = True
            self._changed.notify_all()
        await self._background.close()  # the getters were woken above
