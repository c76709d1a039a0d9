"""``BackgroundTasks``: a background task's failure is logged once and raised at the owner's
next call and at close; closing cancels what still runs and never swallows a cancellation."""

from __future__ import annotations

import asyncio
import logging

import pytest

from agentrl.errors import InfraError
from agentrl.runtime.background import BackgroundTasks

pytestmark = pytest.mark.timeout(30)


async def _crash(after_s: float = 0.0) -> None:
    await asyncio.sleep(after_s)
    raise RuntimeError("a bug in the loop")


async def test_a_failure_is_raised_at_the_next_check_and_at_close(caplog) -> None:
    caplog.set_level(logging.ERROR, logger="agentrl.runtime.background")
    woken: list[BaseException] = []
    tasks = BackgroundTasks(
        "the test pool", error=lambda e: InfraError(f"crashed: {e}"), on_failure=woken.append
    )
    tasks.check()  # nothing yet
    task = tasks.start(_crash(), name="health")
    await asyncio.wait([task])
    await asyncio.sleep(0)  # the done callback
    with pytest.raises(InfraError, match="crashed: a bug in the loop") as raised:
        tasks.check()
    assert isinstance(raised.value.__cause__, RuntimeError)
    with pytest.raises(InfraError, match="crashed"):
        tasks.check()  # every call, not only the first
    with pytest.raises(InfraError, match="crashed"):
        await tasks.close()
    assert [type(e) for e in woken] == [RuntimeError]  # the owner heard once
    logged = [r for r in caplog.records if "background task health failed" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None


async def test_close_cancels_what_runs_and_a_failure_the_owner_found_counts() -> None:
    tasks = BackgroundTasks("the test owner")
    forever = tasks.start(asyncio.sleep(3600), name="forever")
    assert len(tasks) == 1
    tasks.fail(InfraError("a worker died"))
    tasks.fail(InfraError("a second one"))  # only the first is kept
    with pytest.raises(InfraError, match="a worker died"):
        await tasks.close()
    assert forever.cancelled() and len(tasks) == 0


async def test_close_waits_for_tasks_that_end_on_their_own() -> None:
    tasks = BackgroundTasks("the test owner")
    done = tasks.start(asyncio.sleep(0.05, result="read"), name="reader")
    await tasks.close(timeout_s=5)
    assert done.result() == "read"  # not cancelled: it ended within the wait


async def test_a_cancelled_closer_is_not_swallowed() -> None:
    tasks = BackgroundTasks("the test owner")

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(3600)  # takes its time to stop
            raise

    tasks.start(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    closer = asyncio.create_task(tasks.close())
    await asyncio.sleep(0.05)
    closer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closer


async def test_close_also_waits_for_a_task_started_by_a_failing_one() -> None:
    woke: list[str] = []

    async def wake() -> None:
        await asyncio.sleep(0.01)
        woke.append("woken")

    tasks: BackgroundTasks = BackgroundTasks(
        "the test owner", on_failure=lambda _: tasks.start(wake(), name="wake")
    )
    tasks.start(_crash(after_s=0.01), name="reader")
    with pytest.raises(RuntimeError, match="a bug in the loop"):
        await tasks.close(timeout_s=5)
    assert len(tasks) == 0  # the wake-up it started was not left behind
