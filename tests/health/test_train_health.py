"""`agentrl train` with a health rule in ``health.stop_on`` (real vLLM, the tiny model):
the warning lands in the log, metrics.jsonl and status.json; the run stops after the step
with a checkpoint and says how to go on; ``--resume`` continues; ``agentrl scan`` reads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.monitor import read_metrics, read_status
from agentrl.trainer.checkpoint import latest_checkpoint

AGENTRL = str(Path(sys.executable).parent / "agentrl")

CONFIG = """
[env]
id = "agentrl/Digits-v0"
[rollout]
group_size = 4
concurrency = 16
max_turns = 1
max_tokens_per_turn = 8
max_staleness = 1
[train]
steps = 3
groups_per_step = 2
checkpoint_every = 10
[log]
progress = "plain"
tensorboard = false
plots = false
[health]
# every step's sampled-token entropy is under 100 nats: the rule fires at step 1
entropy_floor = 100.0
stop_on = ["entropy_collapse"]
"""


@pytest.mark.vllm
@pytest.mark.soak  # a whole `agentrl train` (minutes on 2 cores): in `make soak`
@pytest.mark.timeout(900)
def test_stop_on_stops_resumably_and_scan_reads_the_run(tmp_path: Path, model_cache: Path) -> None:
    run_dir = tmp_path / "run"
    config = tmp_path / "health.toml"
    config.write_text(CONFIG)
    env = {**os.environ, "AGENTRL_CACHE": str(model_cache)}
    proc = subprocess.run(
        [AGENTRL, "train", str(config), f'--run.out="{run_dir}"'],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "health: entropy_collapse at step 1" in proc.stderr  # the log
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("agentrl: error: health.stop_on: entropy_collapse")
    assert f"agentrl train --resume {run_dir}" in error and f"agentrl scan {run_dir}" in error
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1]
    assert rows[0]["health"][0]["rule"] == "entropy_collapse"
    assert 0 < rows[0]["entropy"] < 100 and rows[0]["response_tokens"] > 0
    status = read_status(run_dir)
    assert status is not None and status["health"][0]["rule"] == "entropy_collapse"
    assert status["state"] == "stopped"
    assert latest_checkpoint(run_dir / "checkpoints") is not None  # step 1, not a due one

    proc = subprocess.run(
        [AGENTRL, "train", "--resume", str(run_dir), "--health.stop_on=[]"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "resumed at step 1" in proc.stdout
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3]

    proc = subprocess.run(
        [AGENTRL, "scan", str(run_dir), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["steps"] == 3 and report["episodes"] >= 3 * 2 * 4
    assert [w["rule"] for w in report["warnings"]][:1] == ["entropy_collapse"]
