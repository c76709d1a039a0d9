"""The built-in detectors on single episodes: where each draws its line."""

from __future__ import annotations

import pytest

from agentrl.health.detectors import (
    Attempt,
    Episode,
    ScanContext,
    answer_leak,
    extreme_length,
    reward_jump,
    reward_without_success,
)
from tests.health.episodes import episode

pytestmark = pytest.mark.timeout(30)
CONTEXT = ScanContext(success_reward=1.0, median_sampled=40.0)


def one(t, attempts=()) -> Episode:  # type: ignore[no-untyped-def]
    return Episode(t.episode_id, t.attempt, (t,), tuple(attempts))


@pytest.mark.parametrize(
    ("result", "leaks"),
    [
        ("the answer is 1786.", True),
        ("1786", True),
        ("(1786)", True),
        ("17860", False),
        ("21786", False),
        ("1786.5", False),
        ("0.1786", False),
        ("", False),
    ],
)
def test_an_answer_leaks_only_as_a_whole_number(result: str, leaks: bool) -> None:
    t = episode("a/0", [[1] * 20, [2] * 20], info={"target": 1786}, tool_results=[result])
    assert (answer_leak(one(t), CONTEXT) is not None) == leaks


def test_no_answer_in_info_or_a_one_character_answer_is_not_checked() -> None:
    assert answer_leak(one(episode("a/0", [[1], [2]], tool_results=["7"])), CONTEXT) is None
    t = episode("a/0", [[1], [2]], info={"answer": "7"}, tool_results=["7"])
    assert answer_leak(one(t), CONTEXT) is None


def test_extreme_length_against_the_runs_median() -> None:
    for n, flagged in ((160, False), (161, True), (5, False), (4, True), (10, False)):
        assert (extreme_length(one(episode("a/0", [[1] * n])), CONTEXT) is not None) == flagged
    tiny = ScanContext(median_sampled=4.0)  # too short a median to judge by
    assert extreme_length(one(episode("a/0", [[1] * 100])), tiny) is None


def test_reward_without_success() -> None:
    def flags(**kwargs: object) -> bool:
        t = episode("a/0", [[1]], **kwargs)  # type: ignore[arg-type]
        return reward_without_success(one(t), CONTEXT) is not None

    assert not flags(info={"success": True})
    assert not flags(reward=0.0, info={"success": False})
    assert flags(reward=0.5, info={"success": False})
    assert flags(status="truncated")  # a success-level reward, truncated
    assert not flags(status="truncated", reward=0.5)


def test_reward_jump_counts_ended_attempts_and_flags_the_latest() -> None:
    t = episode("a/0", [[1]], attempt=2)
    jumped = (Attempt(0, 0.0, "finished"), Attempt(1, 0.0, "failed"), Attempt(2, 1.0, "finished"))
    assert reward_jump(one(t, jumped), CONTEXT) == "reward jumps between attempts (0: 0, 2: 1)"
    earlier = episode("a/0", [[1]], attempt=0)
    assert reward_jump(one(earlier, jumped), CONTEXT) is None  # flagged once, at the latest
    retried_after_failure = (Attempt(0, 0.0, "failed"), Attempt(1, 1.0, "finished"))
    assert (
        reward_jump(one(episode("a/0", [[1]], attempt=1), retried_after_failure), CONTEXT) is None
    )
