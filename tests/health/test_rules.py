"""Each health rule, driven into its pathology on a recorded-style metric series, fires at
the step the pathology shows, once; the healthy series fires nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentrl.config import HealthConfig
from agentrl.config.health import HEALTH_RULES
from agentrl.health import HealthWatch, default_rules
from tests.health.episodes import healthy_rows

pytestmark = pytest.mark.timeout(30)

Row = dict[str, Any]


def fired(rows: list[Row], **config: Any) -> list[tuple[str, int]]:
    watch = HealthWatch(HealthConfig(**config), max_staleness=2)
    for row in rows:
        watch.observe(row["step"], row)
    return [(w.rule, w.step) for w in watch.fired]


def from_step(start: int, **values: float) -> Callable[[Row], None]:
    """A pathology: from step ``start`` on, these metrics take these values."""

    def change(row: Row) -> None:
        if row["step"] >= start:
            row.update(values)

    return change


def tool_error_burst(row: Row) -> None:
    """40 tool errors at step 20 alone (the counters are cumulative)."""
    if row["step"] >= 20:
        row["errors/tool_errors/timeout"] += 40


def reward_without_success(row: Row) -> None:
    """Success flat at 0.3 all run; reward at 0.3, then 0.9 from step 20."""
    row["success_rate"] = 0.3
    row["reward_mean"] = 0.3 if row["step"] < 20 else 0.9


def without_learning(change: Callable[[Row], None]) -> Callable[[Row], None]:
    """A pathology of a run whose reward stays flat: a policy that narrows while its
    reward rises is converging, and entropy_collapse and degenerate_text stay silent."""

    def both(row: Row) -> None:
        row["reward_mean"] = row["success_rate"] = 0.4
        change(row)

    return both


# rule -> (the pathology, the step it must fire at). With health.window = 5, "now" is a
# mean of 5 steps: a value that jumps at step 20 moves it a fifth of the way per step.
CASES: dict[str, tuple[Callable[[Row], None], int]] = {
    "entropy floor": (without_learning(from_step(20, entropy=0.01)), 20),
    "entropy fall": (
        without_learning(from_step(20, entropy=0.1)),
        24,
    ),  # (~0.45 + 4 * 0.1) / 5 > 0.25 * 0.55
    "kl jump": (from_step(25, kl=0.05), 25),
    "mismatch jump": (from_step(25, logprob_gap_fresh=0.08), 25),
    "length collapse": (from_step(20, response_tokens=15.0), 24),
    "length blow-up": (from_step(20, response_tokens=400.0), 22),
    "single turns": (from_step(20, single_turn_share=1.0), 24),
    "reward without success": (reward_without_success, 21),
    "zero variance": (from_step(20, zero_variance_share=1.0), 24),
    "tool errors": (tool_error_burst, 20),
    "truncation": (from_step(20, truncated_share=0.6), 22),
    "staleness": (from_step(20, staleness_mean=2.0), 24),  # bound 2, 0.9 of it
    "clipped": (from_step(20, clip_fraction=0.4), 22),
    "same completions": (without_learning(from_step(20, repeated_completion_share=0.8)), 20),
    "looping turns": (from_step(30, ngram_repeat_share=0.5), 30),
}
RULE_OF = {
    "entropy floor": "entropy_collapse",
    "entropy fall": "entropy_collapse",
    "kl jump": "kl_accelerating",
    "mismatch jump": "mismatch_accelerating",
    "length collapse": "response_length",
    "length blow-up": "response_length",
    "single turns": "turns_collapse",
    "reward without success": "reward_without_success",
    "zero variance": "zero_variance",
    "tool errors": "tool_errors",
    "truncation": "truncation",
    "staleness": "staleness",
    "clipped": "clipped_weights",
    "same completions": "degenerate_text",
    "looping turns": "degenerate_text",
}


def test_the_healthy_run_fires_nothing() -> None:
    for seed in range(5):
        assert fired(healthy_rows(seed=seed)) == [], f"seed {seed}"


@pytest.mark.parametrize("case", list(CASES))
def test_each_pathology_fires_its_rule_once_at_the_step(case: str) -> None:
    pathology, step = CASES[case]
    rows = healthy_rows()
    for row in rows:
        pathology(row)
    assert fired(rows) == [(RULE_OF[case], step)]


def test_every_rule_is_tested_and_named_in_the_config() -> None:
    names = [r.name for r in default_rules(HealthConfig())]
    assert sorted(names) == sorted(HEALTH_RULES)
    assert set(RULE_OF.values()) == set(HEALTH_RULES)


def test_a_rule_fires_again_only_after_the_metric_recovered() -> None:
    """Trouble at 20-24, recovered 25-29 (3 quiet steps re-arm it), trouble again at 30,
    then a one-step recovery at 35 that is too short to re-arm it."""
    rows = healthy_rows()
    for row in rows:
        row["reward_mean"] = row["success_rate"] = 0.4
        if 20 <= row["step"] < 25 or (row["step"] >= 30 and row["step"] != 35):
            row["entropy"] = 0.01
    assert fired(rows) == [("entropy_collapse", 20), ("entropy_collapse", 30)]
    assert fired(rows, rearm_steps=10) == [("entropy_collapse", 20)]


def test_thresholds_come_from_the_config_and_the_switch_turns_it_all_off() -> None:
    rows = healthy_rows()
    for row in rows:
        without_learning(from_step(20, entropy=0.1))(row)
    assert fired(rows, entropy_floor=0.2) == [("entropy_collapse", 20)]
    assert fired(rows, entropy_drop=0.1) == []
    assert fired(rows, enabled=False) == []


def test_a_rule_without_its_metric_is_inactive_and_the_others_go_on() -> None:
    """No entropy recorded (nan, None, or absent): that rule says nothing; the rest work."""
    rows = healthy_rows()
    for row in rows:
        row["entropy"] = [float("nan"), None][row["step"] % 2]
        if row["step"] % 3 == 0:
            del row["entropy"]
        from_step(20, truncated_share=0.9)(row)
    assert fired(rows) == [("truncation", 21)]  # (3 * ~0.02 + 2 * 0.9) / 5 >= 0.3


def test_the_calculator_demos_recorded_metrics_fire_nothing() -> None:
    """The train rows of a real `make demo` (24 steps, success 33 % -> 93.5 % held out,
    rollout.max_staleness = 1): entropy falls and groups answer alike as the policy learns,
    and staleness sits at its bound of 1 by design; none of it is trouble."""
    from agentrl.health.watch import replay_rows

    path = Path(__file__).parent / "data" / "calculator_demo_metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 24 and rows[-1]["success_rate"] > 0.9
    assert replay_rows(rows, HealthConfig(), max_staleness=1) == []
