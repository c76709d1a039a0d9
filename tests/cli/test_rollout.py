"""`agentrl rollout`: one episode per task unless asked, and an unknown env said first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentrl.cli import _parser, main


def config_of(*argv: str) -> Any:
    from agentrl.cli.rollout import _rollout_config

    args, extra = _parser().parse_known_args(["rollout", *argv])
    return _rollout_config(args, extra)


@pytest.mark.timeout(60)
def test_one_episode_per_task_unless_asked(tmp_path: Path) -> None:
    assert config_of("agentrl/GuessNumber-v0").rollout.group_size == 1  # before: 8
    assert config_of("agentrl/GuessNumber-v0", "--group-size", "4").rollout.group_size == 4
    assert config_of("agentrl/GuessNumber-v0", "--rollout.group_size=2").rollout.group_size == 2
    toml = tmp_path / "c.toml"
    toml.write_text('[env]\nid = "agentrl/GuessNumber-v0"\n[rollout]\ngroup_size = 3\n')
    assert config_of("--config", str(toml)).rollout.group_size == 3
    toml.write_text('[env]\nid = "agentrl/GuessNumber-v0"\n[rollout]\nmax_turns = 3\n')
    assert config_of("--config", str(toml)).rollout.group_size == 1


@pytest.mark.timeout(60)
def test_an_unknown_env_is_the_first_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rollout", "nope/Missing-v0", "--episodes", "3", "--group-size", "2"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "'nope/Missing-v0' is not registered" in lines[0], lines
    assert "multiple" not in lines[0]  # before: "--episodes (3) must be a positive multiple"


@pytest.mark.timeout(60)
def test_a_bad_config_file_is_reported_by_the_config_loader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[rollout\ngroup_size = 2\n")
    assert main(["rollout", "agentrl/GuessNumber-v0", "--config", str(bad)]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "bad.toml" in lines[0], lines  # one line, no traceback
