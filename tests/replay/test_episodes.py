"""Replay of an episode of an env configured with kwargs, and export into a new folder.

A train run stores each task with the env's ``kwargs`` (``tasks.env_kwargs``); the
trajectory does not hold them. Verify, fork and export must use the stored ones: the
shipped guess-number example sets ``[env] kwargs = {low = 1, high = 30, ...}``, and the
env rebuilt with its defaults says "1 to 100" at reset. Real SQLite, the real runner and
env; the policy is scripted (the real-vLLM paths are in test_replay_matrix.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentrl import replay
from agentrl.config import RolloutConfig
from agentrl.rollout import EpisodeRunner, tasks_for
from agentrl.store import EpisodeStore
from tests.rollout.fakes import ScriptedClient

KWARGS = {"low": 1, "high": 30, "max_guesses": 8}
GUESSES = (10, 20, 25, 5, 15, 28, 2, 30)


def guesser(tokenizer: Any) -> Any:
    def reply(prompt_ids: Any) -> str:
        turn = tokenizer.decode(prompt_ids).count("<|im_start|>assistant") - 1
        return f"Guess: {GUESSES[turn % len(GUESSES)]}"

    return reply


@pytest.fixture
async def run_dir(tmp_path: Path, tokenizer: Any) -> tuple[Path, str]:
    """A run directory holding one ended guess-number episode of a task with kwargs."""
    (task,) = tasks_for("agentrl/GuessNumber-v0", 1, first_seed=3, **KWARGS)
    runner = EpisodeRunner(
        ScriptedClient(tokenizer, guesser(tokenizer)),
        tokenizer,
        RolloutConfig(max_turns=8, max_tokens_per_turn=16),
    )
    trajectories = await runner.run(task, "ep-0")
    assert "1 to 30" in json.dumps(trajectories[0].env_log[0])  # the kwargs reached the env
    assert len(trajectories[0].turn_starts) >= 2
    out = tmp_path / "run"
    with EpisodeStore.open(out) as store:
        store.add_tasks([task], group_size=1)
        store.episode_started("ep-0", task, 0, 0)
        store.save_episode(trajectories)
    return out, "ep-0"


@pytest.mark.timeout(120)
async def test_verify_and_fork_rebuild_the_env_with_its_recorded_kwargs(
    run_dir: tuple[Path, str],
) -> None:
    out, episode = run_dir
    with EpisodeStore.open(out, create=False) as store:
        recorded = replay.load(store, episode)
    assert recorded.task.env_kwargs == KWARGS  # before: {} (the trajectory's task)
    result = replay.verify(recorded)
    assert result.difference is None, result.difference  # before: "1 to 100" at reset
    point = replay.fork_point(recorded, 1)
    assert point.task.env_kwargs == KWARGS  # the fork continues on the same env


@pytest.mark.timeout(120)
def test_cli_verify_passes_and_export_makes_its_folder(
    run_dir: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agentrl.cli import main

    out, episode = run_dir
    assert main(["replay", str(out), episode, "--verify"]) == 0
    assert "matches" in capsys.readouterr().out

    one = tmp_path / "new" / "deeper" / "one.jsonl"  # folders that do not exist yet
    assert main(["replay", str(out), episode, "--export", str(one)]) == 0
    rows = [json.loads(line) for line in one.read_text().splitlines()]
    assert [r["episode_id"] for r in rows] == [episode]
    every = tmp_path / "all" / "x.jsonl"
    assert main(["replay", str(out), "--export", str(every)]) == 0
    assert every.read_text().count("\n") == 1

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    capsys.readouterr()
    assert main(["replay", str(out), "--export", str(blocked / "x.jsonl")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--export" in err[0] and "a-file" in err[0], err  # no traceback
