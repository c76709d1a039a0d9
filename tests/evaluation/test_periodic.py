"""Evaluation beside training (``eval.every``), without an engine: which steps start one,
that at most one runs, that the trainer is never held, that a failure is not silent;
the eval row's pass@k; the eval plot's data; the config check."""

from __future__ import annotations

import asyncio
import logging

import pytest

from agentrl.config import RunConfig
from agentrl.errors import ConfigError
from agentrl.evaluation import PeriodicEval, eval_line, eval_summary
from agentrl.plots import eval_series
from tests.evaluation.test_report import _episode

pytestmark = pytest.mark.timeout(30)


class Evals:
    """A launch that records its steps and ends when the test releases it."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.recorded: list[int] = []
        self.release: dict[int, asyncio.Event] = {}

    async def __call__(self, step: int) -> None:
        self.started.append(step)
        self.release[step] = asyncio.Event()
        await self.release[step].wait()
        self.recorded.append(step)


async def test_due_steps_skip_the_last_one_and_none_without_every() -> None:
    periodic = PeriodicEval(3, 10, Evals())
    assert [s for s in range(1, 11) if periodic.due(s)] == [3, 6, 9]
    assert [s for s in range(1, 7) if PeriodicEval(2, 6, Evals()).due(s)] == [2, 4]
    assert not any(PeriodicEval(0, 10, Evals()).due(s) for s in range(1, 11))


async def test_step_never_blocks_and_at_most_one_runs(caplog: pytest.LogCaptureFixture) -> None:
    evals = Evals()
    async with PeriodicEval(2, 100, evals) as periodic:
        for step in (1, 2, 3):
            periodic.step(step)  # returns at once: the trainer goes on
        await asyncio.sleep(0)
        assert evals.started == [2] and periodic.running
        with caplog.at_level(logging.WARNING):
            periodic.step(4)  # due, but step 2's still runs: skipped, said
        assert periodic.skipped == [4] and "after step 4 was skipped" in caplog.text
        evals.release[2].set()
        await periodic.wait()
        assert evals.recorded == [2] and not periodic.running
        periodic.step(6)
        await asyncio.sleep(0)
        assert evals.started == [2, 6]
        evals.release[6].set()  # leaving the block waits for it
    assert evals.recorded == [2, 6] and periodic.started == [2, 6]


async def test_a_failed_evaluation_fails_the_run() -> None:
    async def broken(step: int) -> None:
        raise RuntimeError(f"engine gone at step {step}")

    async def training(periodic: PeriodicEval) -> None:
        periodic.step(1)
        await asyncio.sleep(10)  # cancelled by the group when the evaluation fails

    with pytest.raises(BaseExceptionGroup) as caught:
        async with PeriodicEval(1, 5, broken) as periodic:
            await training(periodic)
    assert "engine gone at step 1" in str(caught.value.exceptions[0])


def test_eval_summary_scores_pass_at_k_by_task() -> None:
    rewards = {0: [1.0, 0.0, 0.0, 0.0], 1: [1.0] * 4, 2: [0.0] * 4}
    trajectories = [_episode(t, i, r) for t, rs in rewards.items() for i, r in enumerate(rs)]
    row = eval_summary("during", 6, 6, trajectories, k=4, success_reward=1.0, wall_s=2.0)
    assert (row["label"], row["step"], row["tasks"], row["episodes"], row["k"]) == (
        "during",
        6,
        3,
        12,
        4,
    )
    assert row["success_rate"] == pytest.approx(5 / 12)
    assert row["pass@1"] == pytest.approx((0.25 + 1 + 0) / 3)
    assert row["pass@2"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert row["pass@4"] == pytest.approx(2 / 3) and row["avg@4"] == pytest.approx(row["pass@1"])
    assert row["version_last"] == 6  # no token newer than the version it started with
    assert "eval during (step 6, version 6, 12 held-out episodes)" in eval_line(row)
    assert "pass@4 66.7%" in eval_line(row)
    one = eval_summary("before", 0, 0, trajectories[:4], k=1, success_reward=1.0, wall_s=1.0)
    assert one["pass@1"] == one["success_rate"] == 0.25 and "pass@2" not in one
    assert eval_line(one).startswith("eval before (version 0, 4 held-out episodes)")


def test_eval_series_orders_the_rows_by_step() -> None:
    rows = [
        {"label": "after", "step": 4, "success_rate": 0.75, "pass@1": 0.75, "pass@2": 0.9},
        {"label": "before", "step": 0, "success_rate": 0.25, "pass@1": 0.25, "pass@2": 0.4},
        {"label": "during", "step": 2, "success_rate": 0.5, "pass@1": 0.5, "pass@2": 0.6},
    ]
    assert eval_series(rows) == {
        "success rate": [(0, 0.25), (2, 0.5), (4, 0.75)],
        "pass@2": [(0, 0.4), (2, 0.6), (4, 0.9)],
    }


def test_eval_every_needs_held_out_episodes() -> None:
    assert RunConfig.from_dict({"eval": {"every": 5, "episodes": 8}}).eval.every == 5
    with pytest.raises(ConfigError, match=r"eval.every = 5 needs held-out episodes"):
        RunConfig.from_dict({"eval": {"every": 5}})
    with pytest.raises(ConfigError, match=r"eval.every = -1"):
        RunConfig.from_dict({"eval": {"every": -1, "episodes": 8}})
