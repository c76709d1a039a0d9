"""The pass@k estimator against hand-computed values, and the report's per-task scoring."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from agentrl.evaluation import eval_report, pass_at_k, reported_ks
from agentrl.types import TokenSpan, Trajectory


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 2 / 5),  # 1 - C(3,1)/C(5,1) = 1 - 3/5
        (5, 2, 2, 7 / 10),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 2, 3, 9 / 10),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (5, 2, 4, 1.0),  # n - c = 3 < 4: every 4 drawn hold a success
        (10, 3, 5, 11 / 12),  # 1 - C(7,5)/C(10,5) = 1 - 21/252
        (4, 0, 4, 0.0),
        (4, 4, 1, 1.0),
        (4, 1, 4, 1.0),
        (8, 1, 4, 1 / 2),  # 1 - C(7,4)/C(8,4) = 1 - 35/70
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
    ],
)
def test_pass_at_k_hand_computed(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_chen_product_form_and_brute_force() -> None:
    for n in range(1, 9):
        for c, k in itertools.product(range(n + 1), range(1, n + 1)):
            # Chen et al.'s numerically stable form
            product = 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))
            # the fraction of all k-subsets of the n samples that hold a success
            subsets = list(itertools.combinations([1] * c + [0] * (n - c), k))
            brute = sum(any(s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(product, abs=1e-12), (n, c, k)
            assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12), (n, c, k)
        assert pass_at_k(n, 1, 1) == pytest.approx(1 / n)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match=r"must lie in \["):
        pass_at_k(n, c, k)


def test_reported_ks() -> None:
    assert reported_ks(1) == [1]
    assert reported_ks(4) == [1, 2, 4]
    assert reported_ks(5) == [1, 2, 4, 5]
    assert reported_ks(8) == [1, 2, 4, 8]


def _episode(task: int, sample: int, reward: float, *, tool: bool = False) -> Trajectory:
    spans = [TokenSpan("prompt", 0, 2, 0), TokenSpan("assistant", 2, 5, 0)]
    mask = [0, 0, 1, 1, 1]
    if tool:
        spans += [TokenSpan("tool", 5, 7, 0), TokenSpan("assistant", 7, 9, 1)]
        mask += [0, 0, 1, 1]
    n = len(mask)
    return Trajectory(
        episode_id=f"E#{task}/{sample}",
        task_id=f"E#{task}",
        env_id="E",
        seed=task,
        token_ids=np.arange(n),
        logprobs=np.where(np.array(mask) == 1, -0.5, np.nan),
        versions=np.where(np.array(mask) == 1, 0, -1),
        loss_mask=np.array(mask),
        spans=tuple(spans),
        messages=[],
        turn_rewards=[reward],
        reward=reward,
        status="finished",
    )


def test_report_scores_each_task_and_averages_over_tasks() -> None:
    # task 0: 1 success in 4 (one with a tool call); task 1: 4 in 4; task 2: none
    rewards = {0: [1.0, 0.0, 0.0, 0.0], 1: [1.0] * 4, 2: [0.0] * 4}
    trajectories = [
        _episode(t, i, r, tool=(t, i) == (0, 0))
        for t, rs in rewards.items()
        for i, r in enumerate(rs)
    ]
    report = eval_report(reversed(trajectories), env_id="E", model="m", k=4, success_reward=1.0)
    assert [t.task_id for t in report.tasks] == ["E#0", "E#1", "E#2"]
    first = report.tasks[0]
    assert (first.samples, first.successes) == (4, 1)
    assert first.pass_at == {1: 0.25, 2: 0.5, 4: 1.0}  # 1 - C(3,2)/C(4,2) = 1/2
    assert first.tool_use_rate == 0.25
    assert first.turns_mean == pytest.approx(1.25)
    assert first.tokens_mean == pytest.approx((5 + 3 + 3 + 3) / 4)
    summary = report.summary()
    assert summary["pass@1"] == pytest.approx((0.25 + 1 + 0) / 3)
    assert summary["pass@2"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert summary["pass@4"] == pytest.approx((1 + 1 + 0) / 3)
    assert summary["avg@4"] == pytest.approx(summary["pass@1"])
    assert summary["reward_mean"] == pytest.approx(5 / 12)
    assert summary["tool_use_rate"] == pytest.approx(1 / 12)
    assert report.to_json()["per_task"][0]["pass_at"] == {
        "pass@1": 0.25,
        "pass@2": 0.5,
        "pass@4": 1.0,
    }
    assert report.episodes == 12 and not math.isnan(summary["turns_per_episode"])
