"""Where the runner renders: short renderings on the loop (the next request goes out at
once), long ones and those past the pass budget in the render thread, and never on the
loop while the render thread holds the tokenizer."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from agentrl.rollout import EpisodeRunner
from agentrl.rollout import runner as runner_module
from agentrl.rollout.episode import EpisodeProgress, EpisodeState
from agentrl.rollout.turnstile import PassBudget
from agentrl.types import Task
from tests.rollout.fakes import ScriptedClient


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class _Recorder:
    """Renderings that burn a given CPU and record which thread ran them, and when."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float, float]] = []  # (name, thread, start, end)

    def __call__(self, name: str, cpu_s: float) -> str:
        start = time.perf_counter()
        _burn(cpu_s)
        self.calls.append((name, threading.current_thread().name, start, time.perf_counter()))
        return name


def _episode(i: int, conversation: Any = "started") -> EpisodeState:
    """An episode past its first rendering (``conversation`` set) unless told otherwise."""
    task = Task(f"t{i}", "tests/None-v0", seed=i)
    state = EpisodeState(task, f"t{i}/0", 0, 0, EpisodeProgress(f"t{i}/0", task.env_id))
    state.conversation = conversation
    return state


def _runner(tokenizer: Any) -> EpisodeRunner:
    return EpisodeRunner(ScriptedClient(tokenizer, lambda _p: "ok"), tokenizer)


async def test_short_renderings_run_on_the_loop_long_ones_in_the_render_thread(
    tokenizer: Any,
) -> None:
    runner = _runner(tokenizer)
    rec = _Recorder()
    loop_thread = threading.current_thread().name
    short, long = _episode(0), _episode(1)
    # the first rendering of each is unknown: it runs on the loop and is measured
    assert await runner._render(short, rec, "short-1", 0.00005) == "short-1"
    assert await runner._render(long, rec, "long-1", 0.003) == "long-1"
    assert await runner._render(short, rec, "short-2", 0.00005) == "short-2"
    assert await runner._render(long, rec, "long-2", 0.003) == "long-2"
    threads = {name: thread for name, thread, _s, _e in rec.calls}
    assert threads["short-1"] == threads["short-2"] == threads["long-1"] == loop_thread
    assert threads["long-2"] == "render"  # 3 ms last time: too long for the loop
    assert long.render_cpu_s is not None and long.render_cpu_s >= 0.003
    assert runner.metrics.counters["renders_inline"] == 3
    runner.render_lane.close()


async def test_no_rendering_runs_on_the_loop_while_the_render_thread_has_one(
    tokenizer: Any,
) -> None:
    runner = _runner(tokenizer)
    rec = _Recorder()
    long, shorts = _episode(0), [_episode(i) for i in range(1, 6)]
    long.render_cpu_s = 0.05  # goes to the render thread
    for s in shorts:
        s.render_cpu_s = 0.00001  # would go on the loop, were the thread idle

    async def short(i: int) -> None:
        await asyncio.sleep(0.002 * i)  # while the long one runs
        await runner._render(shorts[i], rec, f"short-{i}", 0.00001)

    await asyncio.gather(runner._render(long, rec, "long", 0.05),
                         *(short(i) for i in range(5)))  # fmt: skip
    by_name = {name: (thread, s, e) for name, thread, s, e in rec.calls}
    assert by_name["long"][0] == "render"
    _t, long_start, long_end = by_name["long"]
    for i in range(5):
        thread, start, end = by_name[f"short-{i}"]
        # one thread at a time holds the tokenizer: queued behind the long one
        assert thread == "render", (i, thread)
        assert start >= long_end or end <= long_start
    runner.render_lane.close()


async def test_renderings_past_the_pass_budget_go_to_the_render_thread(
    tokenizer: Any, monkeypatch: Any
) -> None:
    monkeypatch.setattr(runner_module, "INLINE_RENDERS_PER_PASS_S", 0.002)
    runner = _runner(tokenizer)
    rec = _Recorder()
    episodes = [_episode(i) for i in range(10)]
    for e in episodes:
        e.render_cpu_s = 0.0004
    # ten renderings of 0.4 ms wake in one loop pass: 2 ms of them fit on the loop
    await asyncio.gather(*(runner._render(e, rec, f"r{i}", 0.0004) for i, e in enumerate(episodes)))
    threads = [thread for _n, thread, _s, _e in rec.calls]
    on_loop = threads.count(threading.current_thread().name)
    assert 1 <= on_loop <= 5, threads
    assert threads.count("render") == 10 - on_loop
    runner.render_lane.close()


async def test_a_pass_budget_refills_in_the_next_pass() -> None:
    budget = PassBudget(0.001)
    assert budget.allows(0.0006)
    budget.spend(0.0006)
    assert budget.allows(0.0004)
    budget.spend(0.0004)
    assert not budget.allows(0.0001)  # spent for this pass
    await asyncio.sleep(0)  # the next pass
    assert budget.allows(0.001)
