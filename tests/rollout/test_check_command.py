"""The rollout's warning about an episode that does not replay names the exact
`agentrl check-env` command that shows why, and that command does show it."""

from __future__ import annotations

import asyncio
import logging
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentrl.config import RolloutConfig
from agentrl.rollout import EpisodeRunner, Scheduler, tasks_for
from agentrl.rollout.check_command import check_env_command
from agentrl.types import Task
from tests import mines_env
from tests.rollout.fakes import ScriptedClient

MOVES = ("reveal 1 2", "reveal 3 3", "reveal 0 4", "reveal 4 0")


def test_the_command_names_kwargs_and_the_episodes_moves() -> None:
    from agentrl.env import load_env_plugins

    load_env_plugins()  # registers the shipped envs (from the top-level envs package)
    task = Task("t", "agentrl/GuessNumber-v0", 0, env_kwargs={"high": 30})
    log = [{"obs": []}, {"action": "Guess: 7"}, {"tool": "x", "arguments": {}}, {"action": "9"}]
    line = check_env_command(task, log, 3)
    assert shlex.split(line) == [
        "agentrl",
        "check-env",
        "agentrl/GuessNumber-v0",
        "--kwargs",
        '{"high": 30}',
        "--example-action",
        "Guess: 7",
        "--example-action",
        "9",
    ]
    assert "--example-action" not in check_env_command(task, log, 0)


@pytest.mark.timeout(180)
async def test_the_warning_says_a_command_that_shows_the_draw(
    tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from agentrl.queue import TrajectoryQueue

    def reply(ids: Any) -> str:
        turn = tokenizer.decode(ids).count("<|im_start|>assistant") - 1
        return MOVES[turn % len(MOVES)]

    config = RolloutConfig(max_turns=4, max_tokens_per_turn=8, group_size=2, concurrency=4)
    runner = EpisodeRunner(ScriptedClient(tokenizer, reply), tokenizer, config)
    queue = TrajectoryQueue(100)
    with caplog.at_level(logging.WARNING, logger="agentrl.rollout.runner"):
        await Scheduler(runner, queue, config).run(tasks_for("user/Mines-v0", 4))
    (warning,) = [
        r.getMessage() for r in caplog.records if "does not replay from its seed" in r.getMessage()
    ]
    (command,) = [part for part in warning.split("`") if part.startswith("agentrl check-env")]
    argv = shlex.split(command)  # before: `agentrl check-env user/Mines-v0`, which passes
    assert argv[:3] == ["agentrl", "check-env", "user/Mines-v0"], warning
    assert argv[argv.index("--import") + 1] == mines_env.__name__  # how it was registered
    assert argv[argv.index("--example-action") + 1] in MOVES

    shown = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "agentrl.cli", *argv[1:]],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert "FAIL  seeded-determinism" in shown.stdout and "random" in shown.stdout


def test_an_env_run_from_a_file_is_imported_by_its_path(tmp_path: Path) -> None:
    import runpy

    source = Path(mines_env.__file__).read_text().replace("user/Mines", "file/Mines")
    path = tmp_path / "mines_file.py"
    path.write_text(source)
    runpy.run_path(str(path), run_name="__agentrl_env__")  # as --import FILE.py does
    line = check_env_command(Task("t", "file/Mines-v0", 0), [{}, {"action": "reveal 1 1"}], 1)
    assert shlex.split(line)[3:5] == ["--import", str(path)]
