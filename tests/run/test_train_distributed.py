"""`agentrl train` launched on two CPU processes with torchrun (gloo), then --resume.

Rank 0 runs vLLM, the rollout loop, the store and publishing; rank 1 trains on what
rank 0 broadcasts each step (DDP). Numerical equality of the two-process step with
the one-process step is tested in tests/trainer/test_distributed_cpu.py; this test
proves the launch path of the product command: both ranks start, train every step,
stop together, and a resumed launch continues from the checkpoint.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentrl.inference.server import free_port
from tests.faults.harness import audit

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
CONFIG = """
[run]
name = "two-procs"
[env]
id = "agentrl/Digits-v0"
[rollout]
group_size = 8
concurrency = 16
max_turns = 1
max_tokens_per_turn = 16
[train]
steps = 2
groups_per_step = 2
checkpoint_every = 1
[eval]
episodes = 0
[log]
progress = "plain"
plots = false
"""


def _launch(args: list[str], log: Path, env: dict[str, Any]) -> tuple[int, str]:
    command = [
        TORCHRUN,
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        "-m",
        "agentrl.cli",
        "train",
        *args,
    ]
    with log.open("wb") as out:
        proc = subprocess.run(
            command,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=600,
            start_new_session=True,
        )
    return proc.returncode, log.read_text(errors="replace")


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_two_process_launch_trains_and_resumes(tmp_path: Path, model_cache: Path) -> None:
    config, run_dir = tmp_path / "two.toml", tmp_path / "run"
    config.write_text(CONFIG)
    env = {**os.environ, "AGENTRL_CACHE": str(model_cache), "OMP_NUM_THREADS": "1"}
    rc, log = _launch([str(config), f'--run.out="{run_dir}"'], tmp_path / "first.log", env)
    assert rc == 0, log[-3000:]
    assert "training on 2 processes (DistributedType.MULTI_CPU); this is rank 0" in log
    assert "done: 2 steps" in log
    first = audit(run_dir)
    assert first["ok"] and first["consumed_steps"] == 2 and first["integrity"] == "ok"

    rc, log = _launch(["--resume", str(run_dir), "--train.steps=3"], tmp_path / "resume.log", env)
    assert rc == 0, log[-3000:]
    assert "resumed at step 2" in log and "done: 3 steps" in log
    end = audit(run_dir)
    assert end["ok"] and end["consumed_steps"] == 3 and end["trained_tasks"] == 6


def test_a_launch_on_several_processes_needs_run_out(tmp_path: Path) -> None:
    config = tmp_path / "two.toml"
    config.write_text(CONFIG)
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2"}
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "agentrl"), "train", str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "needs run.out (all ranks must agree on the run directory)" in proc.stderr
