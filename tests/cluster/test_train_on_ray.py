"""`agentrl train` on a real two-node Ray cluster: two trainer ranks (rank 1 an actor,
gloo) and two rollout-worker actors, real vLLM on CPU; one worker actor killed mid-run is
started again and its episodes continue from their checkpoints; the run finishes and
every task is trained once (`agentrl audit` clean). Soak: several minutes."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agentrl.store.schema import STORE_FILE
from tests.faults.harness import audit

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """
[run]
name = "on-ray"
[env]
id = "agentrl/Digits-v0"
[rollout]
group_size = 8
concurrency = 16
max_turns = 1
max_tokens_per_turn = 16
workers = 2
[train]
steps = 3
groups_per_step = 2
checkpoint_every = 1
[eval]
episodes = 0
[log]
progress = "plain"
plots = false
[cluster]
backend = "ray"
address = "{address}"
trainer_ranks = 2
trainer_resources = {{ node2 = 0.5 }}
worker_resources = {{ CPU = 1 }}
max_restarts = 1
"""


def _trajectories(run_dir: Path) -> int:
    try:
        with sqlite3.connect(f"file:{run_dir / STORE_FILE}?mode=ro", uri=True) as db:
            return db.execute("SELECT count(*) FROM trajectories").fetchone()[0]
    except sqlite3.Error:
        return 0


def _worker_pids() -> list[int]:
    """The processes of the rollout-worker actors (Ray names them by class and method)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            title = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if proc.name.isdigit() and title.startswith(b"ray::_WorkerActor"):
            pids.append(int(proc.name))
    return pids


@pytest.mark.soak
@pytest.mark.vllm
@pytest.mark.timeout(1500)
def test_train_on_ray_survives_a_worker_actor_kill(
    head_and_node2: Any, tmp_path: Path, model_cache: Path, record_fault: Any
) -> None:
    config, run_dir = tmp_path / "ray.toml", tmp_path / "run"
    config.write_text(CONFIG.format(address=head_and_node2.address))
    env = {
        **os.environ,
        "AGENTRL_CACHE": str(model_cache),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "agentrl.cli", "train"]
    with (tmp_path / "train.log").open("wb") as out:
        proc = subprocess.Popen(
            [*command, str(config), f'--run.out="{run_dir}"'],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        try:
            deadline = time.monotonic() + 600
            while _trajectories(run_dir) == 0 and proc.poll() is None:
                assert time.monotonic() < deadline, "no episode ended in 600 s"
                time.sleep(1)
            pids = _worker_pids()
            assert len(pids) == 2, pids
            os.kill(pids[0], signal.SIGKILL)
            rc = proc.wait(900)
        finally:
            if proc.poll() is None:
                proc.kill()
    log = (tmp_path / "train.log").read_text(errors="replace")
    end = audit(run_dir)
    record_fault(
        "Ray: SIGKILL of a rollout-worker actor during `agentrl train` (2 ranks, "
        "2 worker actors): the worker started again, its episodes continued",
        injected=1,
        survived=int(rc == 0 and end["ok"]),
        lost=len(end["lost"]),
        trained_twice=len(end["trained_twice"]),
    )
    assert rc == 0 and "done: 3 steps" in log, log[-3000:]
    assert "starting it again" in log and "training on 2 processes" in log, log[-3000:]
    assert end["ok"] and end["integrity"] == "ok" and end["consumed_steps"] == 3, end
    assert end["lost"] == [] and end["trained_twice"] == [], end
