"""`agentrl rollout`: N episodes against real vLLM, written to a run directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.types import Trajectory

CLI = [sys.executable, "-m", "agentrl.cli", "rollout"]


@pytest.mark.vllm
def test_rollout_writes_every_episode(tmp_path: Path, model_cache: Path) -> None:
    env = {**os.environ, "AGENTRL_CACHE": str(model_cache)}
    out = subprocess.run(
        [
            *CLI,
            "agentrl/Calculator-v0",
            "--episodes",
            "8",
            "--group-size",
            "2",
            "--max-tokens",
            "24",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "8 episodes of agentrl/Calculator-v0" in out.stdout.splitlines()[-1]
    assert "leaked" not in out.stderr, "interpreter teardown noise after the results"
    # what vLLM's processes print as they start is in the run's log (tests/inference/test_quiet.py)
    assert (tmp_path / "run" / "logs" / "vllm-engine.log").is_file()
    assert "Triton is installed" not in out.stderr and "NUMA binding" not in out.stderr
    lines = (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    trajectories = [Trajectory.from_json(json.loads(line)) for line in lines]
    assert len({t.episode_id for t in trajectories}) == 8
    assert {t.seed for t in trajectories} == {0, 1, 2, 3}  # 4 tasks, 2 episodes each
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["episodes"] == 8 and summary["tokens_sampled"] > 0
    assert "loop_lag_s/p99" in summary["metrics"]


@pytest.mark.vllm
def test_rollout_with_worker_processes(tmp_path: Path, model_cache: Path) -> None:
    """`--workers 2`: the episodes run in two worker processes against the one real vLLM
    engine of this process; every episode is stored once and the workers' counts arrive."""
    from agentrl.store import EpisodeStore

    env = {**os.environ, "AGENTRL_CACHE": str(model_cache)}
    out = subprocess.run(
        [
            *CLI,
            "agentrl/Calculator-v0",
            "--episodes",
            "16",
            "--group-size",
            "2",
            "--max-tokens",
            "24",
            "--workers",
            "2",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "16 episodes of agentrl/Calculator-v0" in out.stdout.splitlines()[-1]
    assert "leaked" not in out.stderr, "teardown noise from a worker process"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["episodes"] == 16
    metrics = summary["metrics"]
    assert metrics["episodes_started"] == 16  # counted in the workers, merged here
    assert metrics["tokens_sampled"] == summary["tokens_sampled"] > 0
    store = EpisodeStore.open(tmp_path / "run")
    try:
        assert store.audit()["ok"]
        assert len({t.episode_id for t in store.all_trajectories()}) == 16
    finally:
        store.close()


def test_rollout_refuses_bad_arguments_before_starting_vllm(tmp_path: Path) -> None:
    out = subprocess.run(
        [*CLI, "agentrl/Calculator-v0", "--episodes", "7", "--group-size", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1 and "multiple of --group-size (2)" in out.stderr
    out = subprocess.run(
        [*CLI, "nope/Missing-v0", "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    # the unknown id is the first (and only) error, before any flag arithmetic (issue 53)
    assert out.returncode == 1 and "'nope/Missing-v0' is not registered" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
