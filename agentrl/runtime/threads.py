"""``ThreadLane``: a worker thread an event loop awaits for a fraction of an executor's cost.

The rollout loop hands every sync env call (make, reset, step, close) to the env's own
thread and every chat-template rendering to the runner's render thread, two to three
times a turn. Through ``loop.run_in_executor(ThreadPoolExecutor(1), fn)`` one such hop
cost about 110 µs of CPU on a 2-core machine (a ``concurrent.futures.Future`` with its
lock and condition, the executor's idle-semaphore bookkeeping, a chained asyncio future,
and one write to the loop's self-pipe plus one wake-up of the loop per call): a third of
the loop's CPU per turn against an instant engine (``benchmarks/bench_ceiling.py``).

A lane does the same work with less: calls go to the thread through a
:class:`queue.SimpleQueue`, results come back through one inbox per event loop, and the
loop is woken once for every *batch* of results that lands while it is busy (hundreds of
episodes finish env steps at once), not once per result. What stays as with an
executor:

* calls on one lane run one at a time, in order, in the same thread (an env keeps its
  thread, a tokenizer is never shared between threads);
* a call cancelled before its thread took it never runs; one already running runs to its
  end (threads cannot be interrupted) and its result is dropped;
* an exception raised by the call is raised to the awaiting task;
* no context variables are copied (as ``run_in_executor``).

The thread starts at the first call and ends after :meth:`ThreadLane.close`, or when the
lane is garbage collected. It is a daemon thread: a call hung past its deadline never
holds up the interpreter's exit (an executor's thread is joined at exit).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import math
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

_STOP = object()
"""Put on a lane's queue to end its thread."""


class _Inbox:
    """Results for one event loop; the loop is woken once per batch."""

    __slots__ = ("__weakref__", "_armed", "_items", "_lock", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # weak: the registry of inboxes is keyed by it
        self._items: collections.deque[tuple[asyncio.Future[Any], bool, Any]] = collections.deque()
        self._lock = threading.Lock()
        self._armed = False

    def post(self, future: asyncio.Future[Any], ok: bool, value: Any) -> None:
        """From any thread: deliver ``value`` (a result, or an exception if not ``ok``)."""
        with self._lock:
            self._items.append((future, ok, value))
            if self._armed:  # a wake-up is on its way; it takes this one too
                return
            self._armed = True
        self.call_soon(self._deliver)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop()

    def call_soon(self, fn: Callable[[], Any]) -> None:
        """From any thread: ``fn()`` on the loop (nothing if the loop is gone or closed:
        nobody waits on it any more)."""
        loop = self._loop()
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(fn)

    def _deliver(self) -> None:
        with self._lock:
            self._armed = False
            items, self._items = self._items, collections.deque()
        for future, ok, value in items:
            if future.cancelled():
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)


_inboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Inbox] = weakref.WeakKeyDictionary()
_inboxes_lock = threading.Lock()


def _inbox(loop: asyncio.AbstractEventLoop) -> _Inbox:
    inbox = _inboxes.get(loop)
    if inbox is None:
        with _inboxes_lock:
            inbox = _inboxes.setdefault(loop, _Inbox(loop))
    return inbox


class _Shared:
    """What a lane and its thread share: calls submitted (counted by the loop's thread),
    calls finished (by the lane's), and whether waiting calls are to be cancelled."""

    __slots__ = ("cancel", "finished", "submitted")

    def __init__(self) -> None:
        self.submitted = 0
        self.finished = 0
        self.cancel = False


class ThreadLane:
    """One worker thread whose calls are awaited from an event loop.

    Args:
        name: the thread's name (``threading.current_thread().name`` inside a call).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._shared = _Shared()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._inbox: _Inbox | None = None  # the last caller's loop's (one loop, usually)
        # Collected without close(): the thread ends once the calls before this are done.
        weakref.finalize(self, self._queue.put, _STOP)

    @property
    def busy(self) -> int:
        """Calls submitted and not yet finished (running or waiting for the thread)."""
        return self._shared.submitted - self._shared.finished

    @property
    def thread(self) -> threading.Thread | None:
        """The worker thread (None until the first call)."""
        return self._thread

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in the lane's thread; its result, or its exception.

        Raises:
            RuntimeError: the lane was closed.
        """
        if self._closed:
            raise RuntimeError(f"the thread lane {self.name!r} is closed")
        loop = asyncio.get_running_loop()
        inbox = self._inbox
        if inbox is None or inbox.loop is not loop:
            inbox = self._inbox = _inbox(loop)
        future = loop.create_future()
        if kwargs:
            fn, args = functools.partial(fn, *args, **kwargs), ()
        if self._thread is None:
            self._thread = threading.Thread(
                target=_serve,
                args=(self._queue, self._shared),
                name=self.name,
                daemon=True,
            )
            self._thread.start()
        self._shared.submitted += 1
        self._queue.put((fn, args, future, inbox))
        return await future

    def close(self, *, cancel_pending: bool = False) -> None:
        """Take no more calls; the thread ends after those already submitted (with
        ``cancel_pending``: after the one it is running, the waiting ones are cancelled).
        Idempotent."""
        if cancel_pending:
            self._shared.cancel = True
        if not self._closed:
            self._closed = True
            self._queue.put(_STOP)


def _serve(calls: queue.SimpleQueue[Any], shared: _Shared) -> None:
    """The lane's thread: run calls until told to stop. It holds no reference to the lane,
    so an unreferenced lane is collected and its finalizer stops the thread."""
    while True:
        item = calls.get()
        if item is _STOP:
            return
        fn, args, future, inbox = item
        value = None
        counted = False
        try:
            if shared.cancel:  # closed with cancel_pending: the waiting calls never run
                inbox.call_soon(future.cancel)
                continue
            if future.cancelled():  # cancelled while it waited for the thread: never runs
                continue
            try:
                value, ok = fn(*args), True
            except BaseException as e:  # handed to the awaiting task, as an executor does
                value, ok = e, False
            # Finished before the result is posted: the awaiting task may run (and read
            # ``busy``, say to hand the lane on) before this thread runs another line.
            shared.finished += 1
            counted = True
            inbox.post(future, ok, value)
        finally:
            if not counted:
                shared.finished += 1
            item = fn = args = value = None  # nothing held while the thread waits


class Deadlines:
    """``asyncio.timeout(seconds)`` for many calls of one loop that share ``seconds``,
    on one loop timer instead of one each.

    Each ``asyncio.timeout`` puts a timer handle on the loop's heap and cancels it on
    exit; the heap then holds one live or cancelled handle per call in flight (thousands
    of env calls at once), and every push, pop and clean-up is paid on the loop: with 7
    env calls an episode, replacing them with this took the rollout loop's CPU per turn
    to 0.95 of what it was against an instant engine (``benchmarks/bench_ceiling.py``'s
    1024x3x32 case, in-process A/B). Deadlines of one length come due in the order they
    were made, so here they are kept in buckets of ``resolution`` seconds, oldest first,
    and the loop has one timer, at the oldest bucket's end; entering and leaving a scope
    is adding to and discarding from a set. A scope times out at most ``resolution``
    (:func:`default_resolution`) and 2 ms after its deadline, never before it, on
    asyncio's loop and on uvloop's (whose clock counts whole milliseconds).

    A scope behaves as ``asyncio.timeout``'s: on expiry its task is cancelled, and the
    cancellation leaves the scope as :class:`TimeoutError` unless the task was also
    cancelled from elsewhere (then it stays a ``CancelledError``, and the counts of
    ``Task.cancelling()`` are kept). Use one from the loop it was first entered on (a
    new loop starts it afresh).

    Args:
        seconds: the deadline of every scope, from its entry (``math.inf``: none).
        resolution: how late a deadline may fire, in seconds (None: the default).
    """

    def __init__(self, seconds: float, resolution: float | None = None) -> None:
        if not seconds > 0:
            raise ValueError(f"a deadline must be a positive number of seconds, not {seconds!r}")
        self.seconds = float(seconds)
        self.resolution = default_resolution(seconds) if resolution is None else resolution
        if not 0 < self.resolution < math.inf:
            raise ValueError(f"the resolution must be positive, not {self.resolution!r}")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._buckets: collections.deque[tuple[int, set[_Scope]]] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None

    def __call__(self) -> _Scope:
        """A scope: ``async with deadlines(): ...`` times out ``seconds`` after entry."""
        return _Scope(self)

    def _add(self, scope: _Scope) -> set[_Scope]:
        if self.seconds == math.inf:  # no deadline: a set of its own, never looked at
            return set()
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # first use, or a new loop: the old one's timer is gone
            self._loop, self._timer = loop, None
            self._buckets.clear()
        # ceil: never early (and a clock tick more: uvloop's clock and timers are in whole
        # milliseconds, so its loop.time() lags and its timers fire up to 1 ms early)
        key = -int(-(loop.time() + self.seconds + _CLOCK_TICK) // self.resolution)
        buckets = self._buckets
        if buckets and buckets[-1][0] >= key:  # the clock is monotonic: only == here
            bucket = buckets[-1][1]
        else:
            bucket = set()
            buckets.append((key, bucket))
            if self._timer is None:
                self._timer = loop.call_at(key * self.resolution + _CLOCK_TICK, self._fire)
        bucket.add(scope)
        return bucket

    def _fire(self) -> None:
        """The oldest bucket's end: every scope still in it (and in any other bucket due
        by now) has run past its deadline."""
        self._timer = None
        loop = self._loop
        assert loop is not None
        now, buckets = loop.time(), self._buckets
        while buckets and buckets[0][0] * self.resolution <= now:
            _key, bucket = buckets.popleft()
            for scope in bucket:
                scope._expire()
            bucket.clear()
        if buckets:
            self._timer = loop.call_at(buckets[0][0] * self.resolution + _CLOCK_TICK, self._fire)

    @property
    def pending(self) -> int:
        """Scopes entered and neither left nor expired."""
        return sum(len(b) for _k, b in self._buckets)


_CLOCK_TICK = 0.001
"""The coarsest loop clock in use (uvloop's: whole milliseconds)."""


def default_resolution(seconds: float) -> float:
    """How late a deadline of ``seconds`` may fire by default: 1/64 of it, at most 50 ms
    (a 60 s env deadline fires within 50 ms of it; a 0.5 s one within 8 ms)."""
    return min(0.05, seconds / 64)


_ENTERED, _EXPIRING, _DONE = 0, 1, 2


class _Scope:
    """One ``async with`` of :class:`Deadlines` (as ``asyncio.Timeout``, on a shared timer)."""

    __slots__ = ("_bucket", "_cancelling", "_owner", "_state", "_task")

    def __init__(self, owner: Deadlines) -> None:
        self._owner = owner
        self._state = -1
        self._bucket: set[_Scope] | None = None
        self._task: asyncio.Task[Any] | None = None
        self._cancelling = 0

    async def __aenter__(self) -> _Scope:
        if self._state != -1:
            raise RuntimeError("a deadline scope is entered once")
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline scope must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._state = _ENTERED
        self._bucket = self._owner._add(self)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        state, self._state = self._state, _DONE
        if state == _ENTERED:
            assert self._bucket is not None
            self._bucket.discard(self)
        elif state == _EXPIRING:
            assert self._task is not None
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc
        self._bucket = None
        return None

    def _expire(self) -> None:
        if self._state == _ENTERED:
            self._state = _EXPIRING
            assert self._task is not None
            self._task.cancel()
