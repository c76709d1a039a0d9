"""ThreadLane, a thread awaited from an event loop, and Deadlines (agentrl.runtime.threads)."""

from __future__ import annotations

import asyncio
import gc
import math
import threading
import time
from typing import Any

import pytest

from agentrl.runtime.threads import Deadlines, ThreadLane

pytestmark = pytest.mark.timeout(60)


async def test_calls_run_in_order_in_one_thread_and_return_or_raise() -> None:
    lane = ThreadLane("test-lane")
    seen: list[tuple[int, str]] = []

    def note(i: int, *, tag: str) -> int:
        seen.append((i, threading.current_thread().name))
        return i * 2

    results = await asyncio.gather(*(lane.call(note, i, tag="x") for i in range(20)))
    assert results == [i * 2 for i in range(20)]
    assert [i for i, _ in seen] == list(range(20))
    assert {name for _, name in seen} == {"test-lane"}
    assert lane.thread is not None and lane.thread.daemon
    with pytest.raises(ZeroDivisionError):
        await lane.call(lambda: 1 / 0)
    assert lane.busy == 0
    lane.close()
    lane.thread.join(5)
    assert not lane.thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        await lane.call(int)


def _stuck_then_waiting(
    lane: ThreadLane,
) -> tuple[threading.Event, list[int], asyncio.Future[Any], asyncio.Future[Any]]:
    """A call stuck until ``release`` is set, and one waiting behind it (appends to ``ran``)."""
    release = threading.Event()
    ran: list[int] = []
    first = asyncio.ensure_future(lane.call(release.wait, 10))
    second = asyncio.ensure_future(lane.call(ran.append, 1))
    return release, ran, first, second


async def test_a_call_cancelled_while_waiting_never_runs() -> None:
    lane = ThreadLane("test-lane")
    release, ran, first, second = _stuck_then_waiting(lane)
    await asyncio.sleep(0.05)
    assert lane.busy == 2
    second.cancel()
    release.set()
    assert await first is True
    await asyncio.sleep(0.05)
    assert second.cancelled() and ran == [] and lane.busy == 0
    lane.close()


async def test_close_with_cancel_pending_lets_a_stuck_call_finish_and_cancels_the_rest() -> None:
    lane = ThreadLane("test-lane")
    release, ran, stuck, waiting = _stuck_then_waiting(lane)
    await asyncio.sleep(0.05)
    lane.close(cancel_pending=True)
    release.set()
    assert await stuck is True  # the running call ends and is delivered
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert ran == []
    assert lane.thread is not None
    lane.thread.join(5)
    assert not lane.thread.is_alive()


async def test_an_unreferenced_lane_ends_its_thread() -> None:
    lane = ThreadLane("test-lane")
    await lane.call(int)
    thread = lane.thread
    assert thread is not None and thread.is_alive()
    del lane
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


async def test_results_that_land_together_wake_the_loop_once() -> None:
    """The point of the lane: a batch of results costs one wake-up of the loop."""
    loop = asyncio.get_running_loop()
    wakeups = 0
    original = loop.call_soon_threadsafe

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal wakeups
        wakeups += 1
        return original(*args, **kwargs)

    lanes = [ThreadLane(f"test-lane-{i}") for i in range(50)]
    started = threading.Barrier(51)
    calls = [asyncio.ensure_future(lane.call(started.wait, 10)) for lane in lanes]
    await asyncio.sleep(0)  # the calls are submitted
    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:
        started.wait(10)  # every lane runs its call now
        time.sleep(0.3)  # noqa: ASYNC251 (the loop is meant to be blocked while all 50 land)
        await asyncio.gather(*calls)
    finally:
        del loop.call_soon_threadsafe
    assert wakeups <= 2, f"{wakeups} wake-ups for 50 results that landed together"
    for lane in lanes:
        lane.close()


def test_a_result_for_a_closed_loop_is_dropped_quietly() -> None:
    lane = ThreadLane("test-lane")
    release = threading.Event()

    async def submit() -> None:
        pending = asyncio.ensure_future(lane.call(release.wait, 10))
        await asyncio.sleep(0.05)
        assert not pending.done()  # left waiting when its loop closes

    other = asyncio.new_event_loop()
    try:
        other.run_until_complete(submit())
    finally:
        other.close()
    release.set()
    time.sleep(0.1)
    assert lane.busy == 0  # delivered to nobody, without an error in the thread
    assert asyncio.run(lane.call(lambda: 7)) == 7  # the lane serves the next loop
    lane.close()


def test_a_call_hung_past_its_deadline_does_not_hold_up_the_exit() -> None:
    """An executor's thread is joined at exit; a lane's is a daemon."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import asyncio, threading
        from agentrl.runtime.threads import ThreadLane

        async def main():
            try:
                async with asyncio.timeout(0.2):
                    await ThreadLane("hung").call(threading.Event().wait)
            except TimeoutError:
                print("timed out", flush=True)

        asyncio.run(main())
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.strip() == "timed out", done.stderr


# Deadlines: asyncio.timeout for many same-length calls, on one loop timer


async def test_a_scope_past_its_deadline_raises_timeout_error_neither_early_nor_much_late() -> None:
    deadlines = Deadlines(0.2, resolution=0.02)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(TimeoutError):
        async with deadlines():
            await asyncio.sleep(5)
    waited = loop.time() - t0
    assert 0.2 <= waited < 0.2 + 0.5, waited  # never early; late by the resolution (+ load)
    assert deadlines.pending == 0
    # Calls that finish in time are untouched, and leave nothing behind.
    async with deadlines():
        await asyncio.sleep(0.01)
    assert deadlines.pending == 0
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_many_scopes_expire_each_at_its_own_deadline_on_one_timer() -> None:
    deadlines = Deadlines(0.3, resolution=0.01)
    loop = asyncio.get_running_loop()
    heap_before = len(loop._scheduled)  # type: ignore[attr-defined]
    outcomes: dict[int, str] = {}
    started: dict[int, float] = {}
    ended: dict[int, float] = {}

    async def call(i: int, seconds: float) -> None:
        started[i] = loop.time()
        try:
            async with deadlines():
                await asyncio.sleep(seconds)
            outcomes[i] = "done"
        except TimeoutError:
            outcomes[i] = "timed out"
        ended[i] = loop.time()

    tasks = []
    for i in range(200):  # every other call hangs; entries spread over 0.1 s
        tasks.append(asyncio.create_task(call(i, 10 if i % 2 else 0.05)))
        if i % 20 == 19:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0)
    # The sleeps are on the heap (one each); the deadlines add one timer, not 200.
    assert len(loop._scheduled) <= heap_before + 200 + 1  # type: ignore[attr-defined]
    await asyncio.gather(*tasks)
    assert [outcomes[i] for i in range(200)] == [
        "timed out" if i % 2 else "done" for i in range(200)
    ]
    late = [ended[i] - started[i] - 0.3 for i in range(1, 200, 2)]
    assert min(late) >= 0 and max(late) < 0.5, (min(late), max(late))  # slack: a loaded CI
    assert deadlines.pending == 0


async def test_a_cancel_from_elsewhere_stays_a_cancel_and_counts_stay_balanced() -> None:
    deadlines = Deadlines(10)
    inner_entered = asyncio.Event()

    async def hangs() -> None:
        async with deadlines():
            inner_entered.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(hangs())
    await inner_entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert deadlines.pending == 0

    # Expired and cancelled from elsewhere at once: a cancel, as asyncio.timeout does.
    both = Deadlines(0.05, resolution=0.01)

    seen: list[str] = []

    async def expires_then_cancelled() -> None:
        try:
            async with both():
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    asyncio.current_task().cancel()  # type: ignore[union-attr]
                    raise
        except TimeoutError:
            seen.append("timeout")
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(expires_then_cancelled())
    assert seen == ["cancelled"]

    # Nested in an outer asyncio.timeout that fires first: the outer one's TimeoutError.
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            async with Deadlines(10)():
                await asyncio.sleep(30)


async def test_a_scope_is_entered_once_and_only_in_a_task() -> None:
    deadlines = Deadlines(1)
    scope = deadlines()
    async with scope:
        pass
    with pytest.raises(RuntimeError, match="entered once"):
        async with scope:
            pass
    with pytest.raises(ValueError, match="positive number of seconds"):
        Deadlines(0)
    async with Deadlines(math.inf)():  # no deadline at all
        await asyncio.sleep(0.01)


def test_deadlines_start_afresh_on_a_new_loop() -> None:
    deadlines = Deadlines(0.1, resolution=0.01)

    async def once() -> str:
        try:
            async with deadlines():
                await asyncio.sleep(5)
        except TimeoutError:
            return "timed out"
        return "done"

    assert asyncio.run(once()) == "timed out"
    assert asyncio.run(once()) == "timed out"  # the first loop's timer went with it


def test_deadlines_are_never_early_by_the_real_clock_on_uvloop() -> None:
    """uvloop's clock and timers count whole milliseconds (its ``loop.time()`` lags the
    real clock by up to 1 ms; a timer may fire up to 1 ms early): a deadline still never
    expires before its length has passed by ``time.monotonic``. The rollout workers run on
    uvloop (``rollout.worker_event_loop``)."""
    uvloop = pytest.importorskip("uvloop")
    deadlines = Deadlines(0.02, resolution=0.001)

    async def one() -> float:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            async with deadlines():
                await asyncio.sleep(5)
        return time.monotonic() - t0

    async def many() -> list[float]:
        waited = []
        for i in range(60):
            end = time.monotonic() + (i % 10) * 0.00011  # entries at every phase of a tick
            while time.monotonic() < end:
                pass
            waited.append(await one())
        return waited

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        waited = runner.run(many())
    assert min(waited) >= 0.02, min(waited)
    assert max(waited) < 0.02 + 0.5, max(waited)  # slack: a loaded CI machine


class _CoarseClockLoop(asyncio.SelectorEventLoop):
    """A loop with a clock like uvloop's: ``time()`` in whole ticks (up to a tick behind
    the real clock) and timers that may fire up to a tick early. The tick is 1/1024 s,
    exact in binary, so no rounding of the deadline arithmetic adds a tick by chance."""

    TICK = 2.0**-10

    def time(self) -> float:
        return math.floor(time.monotonic() / self.TICK) * self.TICK

    def call_at(self, when: float, callback: Any, *args: Any, context: Any = None) -> Any:
        return super().call_at(when - self.TICK, callback, *args, context=context)


def test_deadlines_are_never_early_on_a_clock_of_whole_ticks() -> None:
    tick = _CoarseClockLoop.TICK
    deadlines = Deadlines(10 * tick, resolution=tick)

    async def many() -> list[float]:
        waited = []
        for i in range(100):
            end = time.monotonic() + (i % 10) * tick / 10  # entries at every phase of a tick
            while time.monotonic() < end:
                pass
            t0 = time.monotonic()
            with pytest.raises(TimeoutError):
                async with deadlines():
                    await asyncio.sleep(5)
            waited.append(time.monotonic() - t0)
        return waited

    with asyncio.Runner(loop_factory=_CoarseClockLoop) as runner:
        waited = runner.run(many())
    assert min(waited) >= 10 * tick, min(waited)
