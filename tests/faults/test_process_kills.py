"""SIGKILL `agentrl train` five times in one run, each at a different moment; --resume.

Four kills come from named fault points inside the process (``AGENTRL_FAULTS``): right
after tokens were sampled, half-way through a store transaction, with the engine
paused for a weight update, and between the backward pass and the optimizer step.
The fifth is a SIGKILL from outside at a random moment. After every kill the store
passes ``integrity_check`` and the audit; the last ``--resume`` finishes the run, and
then every task is trained, failed with a reason, or still resumable; no task was
trained twice and no trajectory was lost.
"""

from __future__ import annotations

import contextlib
import random
import time
from pathlib import Path
from typing import Any

import pytest

from tests.faults.harness import (
    AGENTRL,
    Proc,
    agentrl_env,
    audit,
    consumed_steps,
    digits_config,
    wait_until,
)

STEPS = 12
KILLS = ["generation@70", "store_write@15", "weight_update@2", "optimizer_step@3", None]


@pytest.mark.soak
@pytest.mark.vllm
@pytest.mark.timeout(1500)
def test_five_kills_at_five_moments_then_resume_loses_nothing(
    tmp_path: Path, model_cache: Path, record_fault: Any
) -> None:
    run_dir = tmp_path / "run"
    config = digits_config(tmp_path, steps=STEPS)
    rng = random.Random(7)
    audits, progress = [], []
    for i, fault in enumerate(KILLS):
        env = agentrl_env(model_cache, **({"AGENTRL_FAULTS": fault} if fault else {}))
        args = (
            [AGENTRL, "train", str(config), f'--run.out="{run_dir}"']
            if i == 0
            else [AGENTRL, "train", "--resume", str(run_dir)]
        )
        before = consumed_steps(run_dir)
        proc = Proc(args, tmp_path / f"attempt-{i}.log", env)
        if fault is None:  # from outside, at a random moment once it trains again
            wait_until(lambda b=before: consumed_steps(run_dir) > b, "a step", 400, proc)
            time.sleep(rng.uniform(0.2, 3.0))
            proc.kill()
        rc = proc.wait(600)
        point = fault.split("@")[0] if fault else "random moment (SIGKILL from outside)"
        assert rc == -9, f"attempt {i} ({point}) ended with {rc}, not SIGKILL:\n{proc.tail()}"
        if fault:
            assert f"SIGKILL at {point}" in proc.text()
        audits.append(audit(run_dir))
        progress.append(consumed_steps(run_dir))

    final = Proc(
        [AGENTRL, "train", "--resume", str(run_dir)],
        tmp_path / "final.log",
        agentrl_env(model_cache),
    )
    rc = final.wait(900)
    end = audit(run_dir)
    lost = len(end["lost"]) + sum(len(a["lost"]) for a in audits)
    twice = len(end["trained_twice"]) + sum(len(a["trained_twice"]) for a in audits)
    for fault in KILLS:
        record_fault(
            f"SIGKILL of `agentrl train` at {fault.split('@')[0] if fault else 'random'}",
            injected=1,
            survived=int(rc == 0 and end["ok"]),
            lost=lost,
            trained_twice=twice,
        )

    assert rc == 0, final.tail()
    assert all(a["integrity"] == "ok" for a in [*audits, end])
    assert lost == 0 and twice == 0, (end["lost"], end["trained_twice"])
    assert end["consumed_steps"] == STEPS
    assert end["trained_tasks"] == STEPS * 4  # groups_per_step
    assert progress == sorted(progress), f"training went backwards: {progress}"
    assert f"done: {STEPS} steps" in final.text()


def test_resume_warns_when_the_killed_runs_engine_process_lives_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A SIGKILLed run cannot stop its engine child: --resume says so and how to end it."""
    import json
    import os
    import signal
    import subprocess
    import sys

    from agentrl.run_setup import _warn_leftover_engine

    # a group leader with a child that outlives it, as `agentrl train` and vLLM's engine
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "time.sleep(60)",
        ],
        start_new_session=True,
    )
    try:
        (tmp_path / "status.json").write_text(json.dumps({"pid": leader.pid}))
        _warn_leftover_engine(tmp_path)
        assert capsys.readouterr().err == "", "the run itself still lives: no warning"
        time.sleep(0.5)  # let the child start
        os.kill(leader.pid, signal.SIGKILL)
        leader.wait()
        _warn_leftover_engine(tmp_path)
        err = capsys.readouterr().err
        assert f"the previous run (pid {leader.pid}) is gone" in err
        assert f"kill -9 -{leader.pid}" in err
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, signal.SIGKILL)
    for _ in range(50):  # the orphan is reaped by init shortly after
        try:
            os.killpg(leader.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    _warn_leftover_engine(tmp_path)
    assert capsys.readouterr().err == "", "nothing left: no warning"
