"""The train hook: the run's status runs the rules on each step's row, puts the warning
in the row, status.json and the display, and ``stop_on`` stops the run resumably."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.config import HealthConfig, RunConfig
from agentrl.errors import AgentRLError, StopRequested
from agentrl.health import HealthStop, HealthWatch, replay_rows
from agentrl.monitor import headline, plain_line
from agentrl.runtime.metrics import Metrics
from agentrl.status import RunStatus
from tests.health.episodes import episode, group, healthy_rows

pytestmark = pytest.mark.timeout(60)


def test_stop_on_raises_after_the_step_naming_the_rule_and_the_resume_command() -> None:
    watch = HealthWatch(HealthConfig(stop_on=("entropy_collapse",)))
    watch.observe(1, {"entropy": 0.5})
    watch.raise_if_stopping("runs/x")  # nothing fired: no stop
    watch.observe(2, {"entropy": 0.001})
    with pytest.raises(HealthStop) as stop:
        watch.raise_if_stopping("runs/x")
    text = str(stop.value)
    assert "entropy_collapse" in text and "step 2" in text
    assert "agentrl train --resume runs/x" in text and "agentrl scan runs/x" in text
    assert isinstance(stop.value, StopRequested) and isinstance(stop.value, AgentRLError)
    watch.observe(3, {"entropy": 0.001})  # still collapsed: no second warning, no stop
    watch.raise_if_stopping("runs/x")


def test_a_rule_not_in_stop_on_only_warns() -> None:
    watch = HealthWatch(HealthConfig(stop_on=("truncation",)))
    assert [w.rule for w in watch.observe(1, {"entropy": 0.001})] == ["entropy_collapse"]
    watch.raise_if_stopping("runs/x")


def test_stop_on_names_are_checked_at_load() -> None:
    from agentrl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"health.stop_on.*entropy_collapse"):
        RunConfig.from_dict({"health": {"stop_on": ["entropy_colapse"]}})
    config = RunConfig.from_dict({"health": {"stop_on": ["degenerate_text"], "window": 3}})
    assert config.health.stop_on == ("degenerate_text",) and config.health.window == 3


def test_replaying_recorded_rows_gives_what_training_gave() -> None:
    rows = healthy_rows()
    for row in rows[20:]:
        row["truncated_share"] = 0.6
    live = HealthWatch(HealthConfig(), max_staleness=2)
    for row in rows:
        live.observe(row["step"], row)
    assert replay_rows(rows, HealthConfig(), max_staleness=2) == live.fired != []


def test_the_status_hook_puts_warnings_in_the_row_status_and_display(tmp_path: Path) -> None:
    """RunStatus.record_step on real groups whose turns start looping at step 3."""
    from agentrl.trainer.loop import StepRecord
    from agentrl.trainer.trainer import StepStats

    status = RunStatus(RunConfig(), tmp_path, Metrics())
    fields = {f: 0.0 for f in StepStats.__dataclass_fields__}
    rows = []
    for step in range(1, 5):
        turn = [7, 8, 9, 10] * 10 if step >= 3 else list(range(step, step + 40))
        groups = [
            group(
                f"t{i}",
                [
                    episode(f"t{i}/{j}", [turn], reward=float(j % 2), texts=[f"{i} {j}"])
                    for j in range(4)
                ],
            )
            for i in range(2)
        ]
        stats = StepStats(
            **{
                **fields,
                "step": step,
                "version": step,
                "fresh_tokens": 0,
                "tokens": 1,
                "sequences": 1,
            }
        )
        rows.append(status.record_step(StepRecord(stats, None, 0.1, groups)))
    assert "health" not in rows[1]
    assert rows[2]["ngram_repeat_share"] == 1.0
    assert rows[2]["health"] == [
        {
            "rule": "degenerate_text",
            "step": 3,
            "message": "100% of assistant turns loop on one repeated n-gram",
        }
    ]
    assert "health" not in rows[3]  # once per episode of trouble
    snap = status.snapshot()
    assert [w["rule"] for w in snap["health"]] == ["degenerate_text"]
    assert "health: degenerate_text" in plain_line(snap)
    label, line = headline(snap)[-1]
    assert label == "health" and "degenerate_text at step 3" in line


def test_a_run_asked_to_stop_ends_stopped_not_failed(tmp_path: Path) -> None:
    status = RunStatus(RunConfig(), tmp_path, Metrics())
    status.ended(BaseExceptionGroup("task group", [HealthStop("health.stop_on: ...")]))
    assert status.state == "stopped"
    status.ended(BaseExceptionGroup("task group", [RuntimeError("engine died")]))
    assert status.state == "failed"
