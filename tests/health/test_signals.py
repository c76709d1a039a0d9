"""The step metrics the rules need, computed from real trajectories and groups."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agentrl.health.signals import loops, step_signals
from tests.health.episodes import episode, group

pytestmark = pytest.mark.timeout(30)


def test_signals_of_a_step() -> None:
    """Two groups of two: one with equal rewards, one where both wrote the same text."""
    a = episode("t0/0", [[10, 11, 12], [13]], reward=1.0, logprob=-0.5, info={"success": True})
    b = episode("t0/1", [[10, 11]], reward=1.0, logprob=-0.5, status="truncated")
    c = episode("t1/0", [[20, 21, 22, 23]], reward=0.0, logprob=-1.5, texts=["Answer: 7"])
    d = episode("t1/1", [[20, 21, 22, 23]], reward=1.0, logprob=-1.5, texts=["Answer: 7"])
    s = step_signals([group("t0", [a, b]), group("t1", [c, d])])
    tokens = [4, 2, 4, 4]
    assert s["response_tokens"] == np.mean(tokens)
    assert s["entropy"] == pytest.approx((0.5 * 6 + 1.5 * 8) / 14)
    assert s["turns_mean"] == 1.25 and s["single_turn_share"] == 0.75
    assert s["truncated_share"] == 0.25 and s["env_success_rate"] == 1.0
    assert s["tool_results"] == 1.0
    assert s["zero_variance_share"] == 0.5  # t0: 1 and 1
    assert s["repeated_completion_share"] == 0.5  # t1: both "Answer: 7"
    assert s["ngram_repeat_share"] == 0.0


def test_no_env_success_signal_is_nan() -> None:
    s = step_signals([group("t0", [episode("t0/0", [[1, 2]])])])
    assert math.isnan(s["env_success_rate"]) and math.isnan(s["zero_variance_share"])


def test_a_turn_that_loops_and_one_that_does_not() -> None:
    rng = np.random.default_rng(0)
    assert loops(np.array([7, 8, 9, 10] * 10 + list(range(100, 120))))
    assert not loops(rng.integers(0, 32_000, 200))
    assert not loops(np.array([1, 2, 3, 4] * 3))  # too short to count
    # a 4-gram three times in a long answer is prose, not a loop
    prose = np.concatenate([rng.integers(0, 32_000, 60), [5, 6, 7, 8]] * 3)
    assert not loops(prose)


def test_short_and_long_turns_are_counted_alike() -> None:
    """Up to 256 tokens the n-grams are counted as tuples, beyond as hashed integers."""
    rng = np.random.default_rng(3)
    for n in (200, 256, 257, 600):
        noise = rng.integers(100, 30_000, n)
        loop = np.concatenate([noise[: n // 2], np.tile([1, 2, 3, 4], n // 8 + 1)])
        assert not loops(noise) and loops(loop), n
