"""Kill a real `agentrl rollout` with SIGKILL at random moments; `--resume` loses nothing.

The killed run directory is also what `agentrl replay` is tested on: show, verify,
export, resume and fork an episode that the kill left unfinished.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from agentrl import replay as replay_api
from agentrl.store import EpisodeStore
from agentrl.types import Trajectory

CLI = [sys.executable, "-m", "agentrl.cli", "rollout"]
EPISODES = 64


def scalar(db: Path, sql: str) -> int:
    """The one value ``sql`` selects from the store at ``db`` (0 before it exists)."""
    if not db.exists():
        return 0
    conn = sqlite3.connect(db, timeout=5)
    try:
        return conn.execute(sql).fetchone()[0]
    except sqlite3.OperationalError:  # not created yet
        return 0
    finally:
        conn.close()


def count(db: Path, table: str) -> int:
    """Rows in ``table`` of the store at ``db``."""
    return scalar(db, f"SELECT COUNT(*) FROM {table}")


def ended(db: Path) -> int:
    """Episodes with a recorded trajectory in the store at ``db``."""
    return scalar(db, "SELECT COUNT(DISTINCT episode_id) FROM trajectories")


@dataclasses.dataclass
class KilledRun:
    out: Path
    copy: Path
    """The run directory as the last kill that caught unfinished episodes left it."""
    env: dict[str, str]
    checkpoints: dict[tuple[str, int], np.ndarray]
    kills: list[tuple[int, int, int]]
    """(attempt, episodes ended when it was killed, return code) of each run."""


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory, model_cache: Path) -> KilledRun:
    tmp_path = tmp_path_factory.mktemp("killed")
    out = tmp_path / "run"
    env = {**os.environ, "AGENTRL_CACHE": str(model_cache)}
    first = [
        *CLI,
        "agentrl/GuessNumber-v0",
        "--episodes",
        str(EPISODES),
        "--group-size",
        "2",
        "--concurrency",
        "12",
        "--max-tokens",
        "48",
        "--out",
        str(out),
    ]
    resume = [*CLI, "--resume", "--out", str(out)]
    rng = random.Random(5)
    checkpoints: dict[tuple[str, int], np.ndarray] = {}
    kills = []
    for attempt in range(3):
        # The backstop: should the polls below miss (two fresh-clone CI runs saw every
        # attempt finish all 64 episodes unkilled), the run kills itself at a random
        # generation: in the first attempt late enough for its first checkpoints to be
        # durable (each episode checkpoints after its first turn), in a resumed one soon
        # (it starts with the killed one's). A first attempt has about 450 generations.
        backstop = rng.randint(40, 250) if attempt == 0 else rng.randint(5, 60)
        proc = subprocess.Popen(
            first if attempt == 0 else resume,
            env={**env, "AGENTRL_FAULTS": f"generation@{backstop}"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            # Kill while the store holds a durable checkpoint, at a random point of what is
            # left of the run: once a random count of episodes has ended, or a random
            # count of polls (1-20, 20 ms apart) has seen checkpoints after this attempt
            # ended an episode (a resumed run starts with the killed one's checkpoints),
            # whichever is first.
            # A random delay (0-3 s after the first checkpoint) let a fresh-clone CI run
            # finish all 64 episodes before each of its three kills. Counting ended
            # episodes alone missed as well, in another CI run: the store's count can jump
            # (a traced run showed 36 ended and 12 checkpoints for 1.6 s, then all 64
            # ended at once), so the poll count bounds the wait.
            deadline = time.monotonic() + 300
            db = out / "episodes.db"
            before = ended(db)
            at = before + max(1, round(rng.uniform(0.05, 0.5) * (EPISODES - before)))
            polls = rng.randint(1, 20)
            while proc.poll() is None:
                assert time.monotonic() < deadline, "the run never checkpointed an episode"
                done = ended(db)
                if done > before and count(db, "partials"):
                    polls -= 1
                    if polls <= 0 or done >= at:
                        break
                time.sleep(0.02)
        finally:
            # the run and the vLLM processes it started (also after the backstop's kill,
            # which takes the run's own process only)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        kills.append((attempt, ended(db), proc.returncode))
        with EpisodeStore.open(out, create=False) as store:
            assert store.integrity_check() == "ok"
            partials = store.partials()
            for p in partials:
                checkpoints[(p.episode_id, p.attempt)] = p.concatenated()["token_ids"]
        if partials:  # keep this state of the run for the replay test
            shutil.rmtree(tmp_path / "as-killed", ignore_errors=True)
            shutil.copytree(out, tmp_path / "as-killed")
    assert any(code == -signal.SIGKILL for _, _, code in kills), kills
    assert checkpoints, f"no kill caught an episode part-way: {kills}"
    return KilledRun(out, tmp_path / "as-killed", env, checkpoints, kills)


@pytest.mark.vllm
def test_sigkill_at_random_moments_then_resume_loses_nothing(killed_run: KilledRun) -> None:
    out, env, checkpoints = killed_run.out, killed_run.env, killed_run.checkpoints
    resume = [*CLI, "--resume", "--out", str(out)]
    done = subprocess.run(resume, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{EPISODES} episodes of agentrl/GuessNumber-v0" in done.stdout

    lines = (out / "trajectories.jsonl").read_text().splitlines()
    trajectories = [Trajectory.from_json(json.loads(line)) for line in lines]
    ids = [(t.episode_id, t.segment) for t in trajectories]
    assert len(ids) == len(set(ids)), "an episode was recorded twice"
    assert {t.episode_id for t in trajectories} == {
        f"agentrl.GuessNumber-v0#{seed}/{i}" for seed in range(32) for i in range(2)
    }, "a task was skipped"
    final = {(t.episode_id, t.attempt): t for t in trajectories if t.segment == 0}
    continued = 0
    for key, tokens in checkpoints.items():
        if key in final:  # same attempt: the checkpoint's tokens are the exact prefix
            assert final[key].token_ids[: len(tokens)].tolist() == tokens.tolist(), key
            # and it records where it resumed (the viewer marks that token)
            at = [r["token"] for r in final[key].info.get("resumed", [])]
            assert len(tokens) in at, (key, len(tokens), at)
            continued += 1
    assert continued > 0
    with EpisodeStore.open(out, create=False) as store:
        assert store.integrity_check() == "ok"
        assert set(store.task_states().values()) == {"complete"}
        assert store.partials() == []
        assert len(store.runs()) == 4


def replay(*args: str, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "agentrl.cli", "replay", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.vllm
def test_replay_of_a_partial_episode_from_a_killed_run(killed_run: KilledRun) -> None:
    run, env = str(killed_run.copy), killed_run.env
    with EpisodeStore.open(killed_run.copy, create=False) as store:
        partials = store.partials()
        assert partials, "the last kill left unfinished episodes"
        # the one furthest along, so that there are turns to fork at
        partial = max(partials, key=lambda p: (p.turn, p.num_sampled))
    episode = partial.episode_id

    listed = replay(run, "--state", "paused", env=env)
    assert listed.returncode == 0, listed.stderr
    assert episode.split("/")[0][:12] in listed.stdout and "paused" in listed.stdout

    shown = replay(run, episode, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "unfinished: checkpoint at version" in shown.stdout and "⟨v0⟩" in shown.stdout
    assert "I am thinking of a number" in shown.stdout

    verified = replay(run, episode, "--verify", env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"{len(partial.env_log) - 1} steps and 0 tool calls replayed" in verified.stdout

    exported = Path(run) / "one.jsonl"
    out = replay(run, episode, "--export", str(exported), env=env)
    assert out.returncode == 0, out.stderr
    (record,) = [json.loads(line) for line in exported.read_text().splitlines()]
    assert record["kind"] == "partial" and len(record["token_ids"]) == partial.num_tokens

    resumed = replay(run, episode, "--resume", "--max-tokens", "16", env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"stored as {episode}~resumed-1" in resumed.stdout
    with EpisodeStore.open(killed_run.copy, create=False) as store:
        (done,) = store.trajectories(f"{episode}~resumed-1")
        prefix = partial.concatenated()["token_ids"]
        assert done.token_ids[: len(prefix)].tolist() == prefix.tolist()
        assert store.untrained_groups() == [] or all(
            not t.episode_id.endswith("~resumed-1")
            for g in store.untrained_groups()
            for t in g.trajectories
        ), "a replayed episode is never trained"

    turn = max(partial.turn - 1, 0)
    forked = replay(run, episode, "--fork-at", str(turn), "--temperature", "0", env=env)
    assert forked.returncode == 0, forked.stderr[-3000:]
    assert f"fork at turn {turn}" in forked.stdout and f"~fork@{turn}-1" in forked.stdout
    assert "recorded" in forked.stdout

    # a corrupted copy of the action log shows up as a difference
    with EpisodeStore.open(killed_run.copy, create=False) as store:
        recorded = replay_api.load(store, episode)
    if len(recorded.env_log) > 1:
        recorded.env_log[1]["obs"] = [{"role": "user", "content": "something else"}]
        result = replay_api.verify(recorded)
        assert result.difference is not None and result.difference.startswith("step 1")
