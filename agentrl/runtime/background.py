"""Background tasks an object starts and owns, whose failure is never lost.

A component that runs work beside its callers (a pool's health checks, the readers of
the rollout workers' pipes, a server's idle-session reaper) starts it through
:class:`BackgroundTasks`. A task that raises is logged once, with its traceback, and
its failure is kept: :meth:`BackgroundTasks.check` re-raises it at the owner's next
call, :meth:`BackgroundTasks.close` (cancel what still runs, wait for it) at the end.
So a background task cannot die while the run hangs on, and cancellation is never
swallowed: closing propagates a cancellation of the closer.

The owner may also record a failure it found itself (:meth:`BackgroundTasks.fail`, e.g.
a worker process that died), so callers see one failure whichever way it came.

This module imports only the standard library.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


class BackgroundTasks:
    """The background tasks of one owner (see the module docs).

    Args:
        owner: who runs the tasks, in words, for the log ("the env server pool").
        error: the error to raise for a task's exception (default: the exception
            itself); it should say what to do next.
        on_failure: called once, on the event loop, with the first failure (wake the
            owner's waiters, fail its pending futures).
    """

    def __init__(
        self,
        owner: str,
        *,
        error: Callable[[BaseException], BaseException] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.owner = owner
        self._error = error
        self._on_failure = on_failure
        self._tasks: set[asyncio.Task[Any]] = set()
        self._failure: BaseException | None = None

    @property
    def failure(self) -> BaseException | None:
        """The first failure (None: none so far)."""
        return self._failure

    def __len__(self) -> int:
        return len(self._tasks)

    def start(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
        """Run ``coro`` as a task named ``name``, owned here until it ends."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def fail(self, error: BaseException) -> None:
        """Record a failure the owner found (only the first is kept)."""
        if self._failure is not None:
            return
        self._failure = error
        if self._on_failure is not None:
            self._on_failure(error)

    def check(self) -> None:
        """Raise the recorded failure, if there is one."""
        if self._failure is not None:
            raise self._raised(self._failure)

    async def close(self, timeout_s: float | None = None) -> None:
        """Wait up to ``timeout_s`` (None: not at all) for the tasks to end on their own,
        cancel the rest and wait for them; then raise the recorded failure, if any."""
        if self._tasks and timeout_s is not None:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)
        while self._tasks:  # again if one started another as it ended (a failure's wake-up)
            tasks = set(self._tasks)
            for task in tasks:
                task.cancel()
            # a cancellation of the closer propagates from here
            await asyncio.gather(*tasks, return_exceptions=True)
            self._tasks -= tasks
        self.check()

    def _raised(self, failure: BaseException) -> BaseException:
        if self._error is None:
            return failure
        error = self._error(failure)
        if error is not failure and error.__cause__ is None:
            error.__cause__ = failure
        return error

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        failure = task.exception()
        if failure is None:
            return
        if self._failure is None:
            logger.error(
                "%s: background task %s failed", self.owner, task.get_name(), exc_info=failure
            )
        self.fail(failure)
