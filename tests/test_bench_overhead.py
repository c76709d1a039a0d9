"""The overhead bench's calibration: a turn's CPU spent on the event loop, or in a thread
beside it, as much as asked for."""

from __future__ import annotations

import asyncio
import time

from benchmarks.bench_overhead import Burner, burn


def test_burn_spends_the_cpu_asked_for_in_the_calling_thread() -> None:
    t0 = time.thread_time()
    burn(20_000)
    assert time.thread_time() - t0 >= 0.020


def test_burner_spends_every_turns_cpu_in_its_thread_not_the_loops() -> None:
    async def run() -> tuple[float, float]:
        burner = Burner(2_000)
        loop0, all0 = time.thread_time(), time.process_time()
        for _ in range(20):  # 20 turns of 2 ms each
            burner.add()
        await burner.finish()
        return time.thread_time() - loop0, time.process_time() - all0

    loop_cpu, all_cpu = asyncio.run(run())
    assert all_cpu >= 0.040  # every turn's 2 ms was spent ...
    assert loop_cpu < 0.020  # ... and not on the loop's thread
