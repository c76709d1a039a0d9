"""``Turnstile``: at most so many episodes through per pass of the event loop.

An asyncio loop runs, in each pass, every callback that was ready when the pass began.
When an engine step finishes hundreds of turns at once, hundreds of episodes wake in
the same pass and each does its turn's CPU work (decode, parse, checkpoint, hand the
next request to the engine) before the loop can do anything else: with 256 sequences
per engine step and a few hundred microseconds each, a pass took 50-130 ms
(``benchmarks/bench_concurrency.py`` at 4096 episodes) and every timer, heartbeat and
weight-update step waited that long. Through a turnstile, the first ``per_pass``
episodes go on at once and the rest wait for later passes, ``per_pass`` at a time, in
arrival order; the same work gets done, in slices the loop can interleave.
"""

from __future__ import annotations

import asyncio
import collections


class Turnstile:
    """Lets ``per_pass`` callers of :meth:`through` on per pass of the running loop."""

    def __init__(self, per_pass: int = 32) -> None:
        if per_pass < 1:
            raise ValueError(f"per_pass must be at least 1, got {per_pass}")
        self.per_pass = per_pass
        self._left = per_pass
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._refill_due = False

    async def through(self) -> None:
        """Return at once while this pass has room, else in a later pass."""
        if not self._refill_due:
            self._refill_due = True
            asyncio.get_running_loop().call_soon(self._refill)
        if self._left > 0 and not self._waiting:
            self._left -= 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        await waiter  # cancelled while waiting: the refill skips it

    @property
    def waiting(self) -> int:
        """Callers held for a later pass."""
        return len(self._waiting)

    def _refill(self) -> None:
        """The next pass: room for ``per_pass``, given first to those waiting."""
        self._left = self.per_pass
        while self._waiting and self._left > 0:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._left -= 1
        if self._waiting:  # more than a pass's worth: refill again in the next pass
            asyncio.get_running_loop().call_soon(self._refill)
        else:
            self._refill_due = False
