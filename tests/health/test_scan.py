"""``agentrl scan`` on a run built with known bad episodes planted in a real store: it
finds every one and flags at most 1 % of the 250 healthy ones; the rules over the run's
metrics.jsonl; a detector of the user's own; and the store is only read."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from agentrl.cli import main
from agentrl.config import RunConfig
from agentrl.health.scan import scan_run
from agentrl.store import EpisodeStore, StoreWriter
from agentrl.types import Task, Trajectory
from tests.health.episodes import episode, healthy_rows

pytestmark = pytest.mark.timeout(60)

HEALTHY = 250


def healthy_episode(i: int, rng: np.random.Generator) -> Trajectory:
    """1-3 turns of 15-40 varied tokens; tool results that do not give the answer away."""
    answer = str(1000 + i)
    turns = [
        list(rng.integers(100, 30_000, int(rng.integers(15, 40))))
        for _ in range(int(rng.integers(1, 4)))
    ]
    results = [f"calculator: {int(rng.integers(0, 999))}" for _ in turns]
    truncated = rng.random() < 0.05
    reward = 0.0 if truncated else float(rng.random() < 0.6)
    return episode(
        f"h{i}/0",
        turns,
        reward=reward,
        tool_results=results,
        status="truncated" if truncated else "finished",
        info={"target": answer, "success": reward == 1.0},
    )


def planted() -> dict[str, list[Trajectory]]:
    """episode id -> its attempts, one bad episode (or two) per detector."""
    rng = np.random.default_rng(1)
    words = [list(rng.integers(100, 30_000, 25))]
    return {
        "loop/0": [episode("loop/0", [words[0], [7, 8, 9, 10] * 12])],
        "gamed/0": [episode("gamed/0", words, reward=1.0, info={"success": False})],
        "cut/0": [episode("cut/0", words, reward=1.0, status="truncated")],
        "long/0": [episode("long/0", [list(rng.integers(100, 30_000, 1200))])],
        "short/0": [episode("short/0", [[101]])],
        "leak/0": [
            episode(
                "leak/0",
                [*words, [11, 12]],
                info={"target": "1786"},
                tool_results=["the answer is 1786."],
            )
        ],
        "jump/0": [
            episode("jump/0", words, reward=0.0, attempt=0),
            episode("jump/0", words, reward=1.0, attempt=1),
        ],
    }


EXPECTED = {
    "loop/0": "repeated_text",
    "gamed/0": "reward_without_success",
    "cut/0": "reward_without_success",
    "long/0": "extreme_length",
    "short/0": "extreme_length",
    "leak/0": "answer_leak",
    "jump/0": "reward_jump",
}


async def write_run(run_dir: Path) -> None:
    rng = np.random.default_rng(0)
    store = EpisodeStore.open(run_dir)
    async with StoreWriter(store) as writer:
        episodes = [[healthy_episode(i, rng)] for i in range(HEALTHY)]
        for attempts in [*episodes, *planted().values()]:
            for t in attempts:
                task = Task(t.task_id, t.env_id, 0)
                writer.task(task, 1)
                writer.started(t.episode_id, task, t.attempt, 0)
                writer.episode([t], retried=t is not attempts[-1])
    store.close()
    (run_dir / "config.toml").write_text(RunConfig().to_toml())
    rows = healthy_rows()
    for row in rows[20:]:
        row["response_tokens"] = 400.0
    with (run_dir / "metrics.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps({"kind": "train", **row}) + "\n")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("run")
    asyncio.run(write_run(path))
    return path


def digest(path: Path) -> str:
    return hashlib.sha256((path / "episodes.db").read_bytes()).hexdigest()


def test_scan_finds_every_planted_episode_and_few_others(run_dir: Path) -> None:
    before = digest(run_dir)
    report = scan_run(run_dir)
    assert digest(run_dir) == before  # read only
    assert report.episodes == HEALTHY + 8
    found = {
        f.episode_id: [name for name, _ in f.reasons]
        for f in report.flagged
        if f.episode_id in EXPECTED
    }
    for episode_id, detector in EXPECTED.items():
        assert detector in found.get(episode_id, []), (episode_id, found.get(episode_id))
    healthy_flagged = [f for f in report.flagged if f.episode_id not in EXPECTED]
    assert len(healthy_flagged) <= HEALTHY // 100, healthy_flagged
    jump = next(f for f in report.flagged if f.episode_id == "jump/0")
    assert jump.attempt == 1 and "0: 0, 1: 1" in jump.reasons[0][1]
    assert jump.replay_command(run_dir) == f"agentrl replay {run_dir} jump/0 --attempt 1"
    # the lengths blow up from step 21 on
    assert [(w.rule, w.step) for w in report.warnings] == [("response_length", 23)]


def test_the_cli_lists_them_with_replay_commands(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["scan", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "1 warnings" in out and "response_length" in out
    assert f"agentrl replay {run_dir} leak/0 --attempt 0" in out
    assert "answer_leak: tool result 1 contains the env's answer '1786'" in out
    assert main(["scan", str(run_dir), "--json", "--skip", "extreme_length"]) == 0
    report = json.loads(capsys.readouterr().out)
    ids = {f["episode"] for f in report["flagged"]}
    assert "long/0" not in ids and "leak/0" in ids and report["steps"] == 40


def test_a_detector_of_ones_own(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "mine.py"
    mine.write_text(
        "def three_turns(episode, context):\n"
        "    turns = sum(m['role'] == 'assistant' for m in episode.final.messages)\n"
        "    return f'{turns} turns' if episode.episode_id == 'h7/0' else None\n"
    )
    assert (
        main(
            [
                "scan",
                str(run_dir),
                "--only",
                "answer_leak",
                "--detector",
                f"{mine}:three_turns",
                "--json",
            ]
        )
        == 0
    )
    flagged = {f["episode"]: f["reasons"] for f in json.loads(capsys.readouterr().out)["flagged"]}
    assert set(flagged) == {"leak/0", "h7/0"}
    assert flagged["h7/0"][0][0] == "three_turns"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--detector", "nomodule_xyz:f"], ["nomodule_xyz", "cannot import"]),
        (["--detector", "json"], ["module:function"]),
        (["--detector", "json:nothing_here"], ["no function", "nothing_here"]),
        (["--only", "spelling"], ["no detector 'spelling'", "answer_leak"]),
    ],
)
def test_bad_flags_get_one_clear_line(
    run_dir: Path, args: list[str], words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["scan", str(run_dir), *args]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("agentrl: error:") and len(err.splitlines()) == 1
    for word in words:
        assert word in err


def test_not_a_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", str(tmp_path)]) == 1
    assert "no episode store" in capsys.readouterr().err
    assert not (tmp_path / "episodes.db").exists()
