"""What the live lines and `agentrl top` show: no metric that does not apply to the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentrl.monitor import eval_cell, plain_line, top, write_status

EVAL = {
    "label": "before",
    "step": 0,
    "version": 0,
    "episodes": 8,
    "k": 1,
    "success_rate": 0.5,
    "tool_use_rate": 0.0,
    "reward_mean": 0.5,
}


def _status(*, tools: bool, mode: str) -> dict[str, Any]:
    return {
        "name": "r",
        "state": "finished",
        "step": 3,
        "steps": 3,
        "version": 3,
        "reward_mean": 0.5,
        "success_rate": 0.5,
        "tool_use_rate": 0.0,
        "tokens_per_s": 100.0,
        "staleness_mean": 0.0,
        "staleness_max": 0,
        "tools": tools,
        "mode": mode,
        "eval": {"before": EVAL},
        "episodes": [
            {
                "episode": "E#1/0",
                "env": "agentrl/X-v0",
                "turn": 2,
                "phase": "engine",
                "started_version": 3,
                "tokens_by_version": {"3": 12},
                "tool_calls": 7,
                "age_s": 1.5,
            }
        ],
    }


@pytest.mark.timeout(30)
def test_plain_line_leaves_out_tool_use_without_tools_and_staleness_in_sync_mode() -> None:
    line = plain_line(_status(tools=False, mode="sync"))
    assert "tool use" not in line and "staleness" not in line
    assert "success 50%" in line and "100 tok/s" in line and "queue 0" in line
    line = plain_line(_status(tools=True, mode="async"))
    assert "success 50%  tool use 0%  100 tok/s  staleness 0.00  queue 0" in line


@pytest.mark.timeout(30)
def test_a_status_written_before_the_fields_existed_shows_everything() -> None:
    old = _status(tools=True, mode="async")
    del old["tools"], old["mode"]
    assert "tool use 0%" in plain_line(old) and "staleness 0.00" in plain_line(old)
    assert "tool use 0.0%" in eval_cell(EVAL)


@pytest.mark.timeout(60)
def test_top_shows_only_the_metrics_that_apply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    write_status(tmp_path, _status(tools=False, mode="sync"))
    assert top(tmp_path, once=True) == 0
    view = capsys.readouterr().out
    assert "success 50.0%" in view and "eval before" in view and "v3:12" in view
    assert "tool use" not in view and "staleness" not in view and "tools" not in view
    write_status(tmp_path, _status(tools=True, mode="async"))
    assert top(tmp_path, once=True) == 0
    view = capsys.readouterr().out
    assert view.count("tool use 0.0%") == 2 and "staleness" in view  # the step's and the eval's
    row = next(line for line in view.splitlines() if "E#1/0" in line)
    assert "tools" in view and " 7 " in row  # the episode's tool calls


@pytest.mark.timeout(60)
def test_top_shows_where_each_piece_runs_on_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    status = _status(tools=False, mode="async")
    write_status(tmp_path, status)
    assert top(tmp_path, once=True) == 0
    assert "cluster" not in capsys.readouterr().out  # one machine: no placement line
    status["placement"] = [
        {
            "piece": "inference",
            "index": 0,
            "node_id": "3f9a1c00",
            "node_ip": "10.0.0.5",
            "state": "alive",
            "restarts": 0,
        },
        {
            "piece": "env",
            "index": 1,
            "node_id": "77be0200",
            "node_ip": "10.0.0.6",
            "state": "restarting",
            "restarts": 2,
        },
    ]
    write_status(tmp_path, status)
    assert top(tmp_path, once=True) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "node 10.0.0." in line]
    assert len(lines) == 2 and "cluster" in lines[0], lines
    assert lines[0].rstrip().endswith("node 10.0.0.5 (3f9a1c): inference 0"), lines
    assert lines[1].rstrip().endswith("node 10.0.0.6 (77be02): env 1 restarting (2 restarts)")


def _row(piece: str, index: int, node: int, **more: Any) -> dict[str, Any]:
    return {
        "piece": piece,
        "index": index,
        "node_id": f"{node}b12cd{node}0000",
        "node_ip": f"10.0.0.{node}",
        "state": "alive",
        "restarts": 0,
        **more,
    }


@pytest.mark.timeout(60)
def test_the_cluster_line_groups_the_pieces_by_node() -> None:
    """Eight pieces on two nodes: one line per node names each piece on it; a piece
    restarted or not alive stands alone with its state, restarts and why; one not yet
    placed has a line of its own; the rows' text is escaped (rich markup)."""
    from rich.console import Console

    from agentrl.monitor import headline

    rows = [
        _row("inference", 0, 2),
        _row("inference", 1, 3),
        _row("env", 0, 2),
        _row("env", 1, 3, state="restarting", restarts=1, reason="its actor does not answer"),
        _row("worker", 0, 2, state="dead", reason="ActorDiedError: [bold]gone[/bold]"),
        _row("worker", 1, 2),
        _row("trainer", 0, 3),
        _row("trainer", 1, 2),
    ]
    (_, cell), *_ = [h for h in headline({"placement": rows}) if h[0] == "cluster"]
    console = Console(width=300, record=True, color_system=None)
    console.print(cell)
    assert console.export_text().splitlines() == [
        "node 10.0.0.2 (2b12cd): inference 0; env 0; worker 0 dead: ActorDiedError: [bold]gone"
        "[/bold]; worker 1; trainer 1",
        "node 10.0.0.3 (3b12cd): inference 1; env 1 restarting (1 restart): its actor does not "
        "answer; trainer 0",
    ]
    both = [_row("inference", 0, 2), _row("inference", 1, 2), _row("worker", 0, 2)]
    (_, cell), *_ = [h for h in headline({"placement": both}) if h[0] == "cluster"]
    assert cell == "node 10.0.0.2 (2b12cd): inference 0,1; worker 0"
    waiting = [_row("trainer", 0, 2), {"piece": "trainer", "index": 1, "state": "starting"}]
    (_, cell), *_ = [h for h in headline({"placement": waiting}) if h[0] == "cluster"]
    assert cell.splitlines()[1] == "not placed yet: [yellow]trainer 1 starting[/]"


@pytest.mark.timeout(60)
def test_the_plain_line_says_when_a_piece_is_not_alive() -> None:
    status = _status(tools=False, mode="async")
    status["placement"] = [_row("worker", 0, 2), _row("worker", 1, 2)]
    assert "pieces" not in plain_line(status)
    status["placement"][1]["state"] = "dead"
    assert "  pieces 1/2 alive" in plain_line(status)
