"""``TrajectoryQueue``: complete groups from the rollout side to the trainer.

Bounded in groups: ``put`` blocks while the queue is full, so rollouts slow down to
the trainer's pace instead of piling up memory. Groups are handed over by reference
(no copy, no second buffer), in order. Staleness is bounded before a group exists, at
admission (:class:`~agentrl.rollout.staleness.Staleness`), so nothing here drops groups.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence

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
        self._closed = False
        self.high_water = 0
        self.put_total = 0
        self.got_total = 0

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
            await self._changed.wait_for(lambda: len(self._groups) < self.maxsize or self._closed)
            if self._closed:
                raise QueueClosed("put() on a closed TrajectoryQueue")
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

    async def get_batch(self, n: int) -> list[Group]:
        return [await self.get() for _ in range(n)]

    async def close(self) -> None:
        """Refuse new puts; getters drain what is left, then get QueueClosed."""
        async with self._changed:
            self._closed = True
            self._changed.notify_all()
