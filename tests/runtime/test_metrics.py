"""``LoopLagMonitor``: records how late the loop wakes, and stopping it leaves no task
behind and never swallows a cancellation of the one who stops it."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentrl.runtime.metrics import LoopLagMonitor, Metrics

pytestmark = pytest.mark.timeout(10)


async def test_lag_is_recorded_and_stop_leaves_no_task() -> None:
    metrics = Metrics()
    before = set(asyncio.all_tasks())
    async with LoopLagMonitor(metrics, interval_s=0.01):
        await asyncio.sleep(0.05)
        time.sleep(0.1)  # noqa: ASYNC251 (blocking the loop on purpose: the next wake-up is late)
        await asyncio.sleep(0.05)
    assert max(metrics.samples["loop_lag_s"]) >= 0.05
    assert set(asyncio.all_tasks()) == before


async def test_a_cancelled_stopper_stays_cancelled() -> None:
    monitor = LoopLagMonitor(Metrics(), interval_s=0.01).start()
    await asyncio.sleep(0.02)
    stopper = asyncio.create_task(monitor.stop())
    await asyncio.sleep(0)  # the stopper is inside stop(), waiting for the monitor's task
    stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    await monitor.stop()  # and a second stop ends what is left
