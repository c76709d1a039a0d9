"""A health-checked set of servers: what the inference pool and the env server pool share.

Both pools put N servers behind one client and treat them the same way: each server
(:class:`Member`) is up or down; a background loop checks every server each
``health_interval_s`` (on :class:`~agentrl.runtime.background.BackgroundTasks`, so a crash of
it is raised at the pool's next call and at its close, never lost); a server that is
down is tried again with a doubling delay (0.5 s up to 8 s); new work goes to the
least loaded server that is ready; while none is, callers wait for one, up to
``reconnect_timeout_s``, and then get the pool's error saying how to resume.

:class:`ServerSet` owns exactly that: the members, the health loop, the least-loaded
choice and the wait for one. What a server *is* (a vLLM server with weights to catch
up, an env server with sessions and a capacity), how it is checked and brought back,
and which work sticks to which server stay in the pools
(:mod:`agentrl.inference.pool`, :mod:`agentrl.remote.pool`).

This module imports only the standard library and :mod:`agentrl.runtime.background`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Generic, TypeVar

from agentrl.runtime.background import BackgroundTasks

FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.5, 8.0
"""The delay between tries of a server that is down: doubling from the first to the most."""
HEALTH_FAILURES_TO_DOWN = 3
"""``/health`` checks failed in a row that take an up server out of the rotation."""


@dataclasses.dataclass(eq=False)
class Member:
    """One server of a pool: whether it is up, its load, when to try it again."""

    url: str
    up: bool = True
    load: int = 0
    """Work in flight on it (requests, or sessions open and being opened)."""
    failed_checks: int = 0
    backoff_s: float = FIRST_BACKOFF_S
    next_try: float = 0.0
    reason: str = ""
    """Why it is down (empty while it is up)."""

    def take_down(self, reason: str) -> bool:
        """Mark it down for ``reason``; False if it already was (nothing changed)."""
        if not self.up:
            return False
        self.up, self.reason, self.failed_checks = False, reason, 0
        self.backoff_s = FIRST_BACKOFF_S
        self.next_try = time.monotonic() + self.backoff_s
        return True

    def bring_up(self) -> None:
        """Mark it up (it answered): back in the rotation, the delay starts over."""
        self.up, self.reason, self.failed_checks = True, "", 0
        self.backoff_s = FIRST_BACKOFF_S

    def retry_later(self, reason: str) -> None:
        """A try to bring it back failed: double the delay before the next one."""
        self.reason = reason
        self.backoff_s = min(self.backoff_s * 2, MAX_BACKOFF_S)
        self.next_try = time.monotonic() + self.backoff_s

    @property
    def due(self) -> bool:
        """It is down and its delay has passed: time to try it again."""
        return not self.up and time.monotonic() >= self.next_try

    def check_failed(self) -> bool:
        """Count one failed check; True when that makes enough to take it down."""
        self.failed_checks += 1
        return self.failed_checks >= HEALTH_FAILURES_TO_DOWN


M = TypeVar("M", bound=Member)


@dataclasses.dataclass
class Waiting:
    """One caller's wait for a server, kept across its tries (a try may fail and wait
    again): the reconnect deadline counts from when it first found no server up."""

    deadline: float | None = None


class ServerSet(Generic[M]):
    """The members of one pool, their health loop and the wait for a ready one.

    Args:
        members: the servers (their URLs distinct).
        owner: who checks them, in words, for the log ("the server pool's health checks").
        error: the pool's error for a crash of its background tasks (it names the crash
            and says how to continue); raised at :meth:`check` and :meth:`close`.
        health_interval_s: seconds between two rounds of checks.
        reconnect_timeout_s: how long :meth:`wait_for_one` waits while no server is up.
        rotate_ties: among equally loaded servers, take turns (False: the first).
    """

    def __init__(
        self,
        members: Sequence[M],
        *,
        owner: str,
        error: Callable[[BaseException], BaseException],
        health_interval_s: float,
        reconnect_timeout_s: float,
        rotate_ties: bool = False,
    ) -> None:
        self.members = list(members)
        self.health_interval_s = health_interval_s
        self.reconnect_timeout_s = reconnect_timeout_s
        self.background = BackgroundTasks(owner, error=error, on_failure=lambda _: self.notify())
        self._rotate = rotate_ties
        self._turn = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed = asyncio.Event()  # replaced by a fresh one on every change

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop the pool runs on (:meth:`notify` may then come from any thread)."""
        self._loop = loop
        self._changed = asyncio.Event()

    def check(self) -> None:
        """Raise the pool's error if a background task (the health loop) crashed."""
        self.background.check()

    def start_health(
        self, check: Callable[[M], Coroutine[Any, Any, None]], *, name: str, check_first: bool
    ) -> asyncio.Task[None]:
        """Start the loop that runs ``check`` on every member each ``health_interval_s``
        (first at once if ``check_first``, else after one interval)."""
        return self.background.start(self._health_loop(check, check_first), name=name)

    async def check_all(self, check: Callable[[M], Coroutine[Any, Any, None]]) -> None:
        """Run ``check`` on every member at once."""
        await asyncio.gather(*(check(m) for m in self.members))

    async def _health_loop(
        self, check: Callable[[M], Coroutine[Any, Any, None]], check_first: bool
    ) -> None:
        if not check_first:
            await asyncio.sleep(self.health_interval_s)
        while True:
            await self.check_all(check)
            await asyncio.sleep(self.health_interval_s)

    async def close(self) -> None:
        """Stop the health loop and every other background task; raise a crash of one."""
        await self.background.close()

    def notify(self) -> None:
        """Wake everyone waiting for a server (they look at the members again); any thread."""
        loop = self._loop
        if loop is not None:
            if loop.is_closed():
                return
            try:
                running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not loop:  # a caller in another thread (a remote env used sync)
                loop.call_soon_threadsafe(self.notify)
                return
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def least_loaded(self, ready: Sequence[M]) -> M:
        """The member of ``ready`` with the least load (ties: see ``rotate_ties``)."""
        if not self._rotate:
            return min(ready, key=lambda m: m.load)
        turn, n = next(self._turn), len(self.members)
        return min(ready, key=lambda m: (m.load, (self.members.index(m) - turn) % n))

    async def wait_for_one(
        self,
        ready: Callable[[M], bool],
        unavailable: Callable[[], BaseException],
        *,
        prefer: M | None = None,
        stop: Callable[[], bool] = lambda: False,
        full: Callable[[M], bool] = lambda m: False,
        wait: bool = True,
        waiting: Waiting | None = None,
    ) -> M | None:
        """A member ready for new work: ``prefer`` if it is ready, else the least loaded.

        While none is ready, waits for a change. An up member that is only ``full``
        (at its limit) is waited for without a deadline; while no member is up (or the
        up ones are not ready for another reason), the wait ends after
        ``reconnect_timeout_s`` with ``unavailable()`` raised.

        Returns:
            The member, or None once ``stop()`` says the caller gave up (an abort), or
            at once when none is ready and ``wait`` is False. ``waiting``: the caller's
            wait so far, when it calls again after a failed try (the deadline goes on).

        Raises:
            BaseException: the pool's error if the health loop crashed (at once, even
                while waiting), or ``unavailable()``.
        """
        waiting = waiting if waiting is not None else Waiting()
        while True:
            if stop():
                return None
            self.check()  # crashed checks: nobody would bring a server back
            candidates = [m for m in self.members if m.up and ready(m)]
            if candidates:
                return prefer if prefer in candidates else self.least_loaded(candidates)
            if not wait:
                return None
            now = time.monotonic()
            if any(m.up and full(m) for m in self.members):
                waiting.deadline = None
            else:
                deadline = waiting.deadline = waiting.deadline or now + self.reconnect_timeout_s
                if now >= deadline:
                    raise unavailable()
            timeout_s = 1.0 if waiting.deadline is None else min(1.0, waiting.deadline - now)
            await self._wait_for_change(timeout_s)

    async def _wait_for_change(self, timeout_s: float) -> None:
        changed = self._changed
        with contextlib.suppress(TimeoutError):  # look again at least each second
            async with asyncio.timeout(timeout_s):
                await changed.wait()
