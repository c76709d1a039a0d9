"""SIGKILL a real training run at random moments; --resume trains every task exactly once.

The run is examples/digits/train.py: real vLLM, concurrent episodes, the trainer
stepping while generation goes on, weights published every step, the episode store
and trainer checkpoints in the run directory.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agentrl.store import EpisodeStore

SCRIPT = Path(__file__).parents[2] / "examples" / "digits" / "train.py"
STEPS, GROUPS_PER_STEP = 20, 4


def consumed_steps(db: Path) -> int:
    if not db.exists():
        return -1
    conn = sqlite3.connect(db, timeout=5)
    try:
        return conn.execute("SELECT COALESCE(MAX(step), 0) FROM consumed").fetchone()[0]
    except sqlite3.OperationalError:
        return -1
    finally:
        conn.close()


# about 110 s: in `make soak`; `make test` kills and resumes runs in test_crash_resume.py
@pytest.mark.soak
@pytest.mark.vllm
def test_sigkill_during_training_then_resume_trains_each_task_once(
    tmp_path: Path, model_cache: Path, record_fault: Any
) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "AGENTRL_CACHE": str(model_cache)}
    first = [sys.executable, str(SCRIPT), "--out", str(out), "--steps", str(STEPS)]
    resume = [sys.executable, str(SCRIPT), "--out", str(out), "--resume"]
    rng = random.Random(11)
    seen_partials: dict[str, int] = {}
    kills = []
    for attempt in range(3):
        log = (tmp_path / f"attempt-{attempt}.log").open("wb")
        proc = subprocess.Popen(
            first if attempt == 0 else resume,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 300
            before = consumed_steps(out / "episodes.db")
            while consumed_steps(out / "episodes.db") <= before and proc.poll() is None:
                assert time.monotonic() < deadline, "the run never trained a step"
                time.sleep(0.1)
            delay = rng.uniform(0.2, 2.5)  # mid-step: generation, update, store or optimizer
            time.sleep(delay)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the run and the vLLM processes it started
            proc.wait(timeout=60)
            log.close()
        kills.append(
            (attempt, round(delay, 2), proc.returncode, consumed_steps(out / "episodes.db"))
        )
        with EpisodeStore.open(out, create=False) as store:
            assert store.integrity_check() == "ok"
            for p in store.partials():
                seen_partials[p.episode_id] = p.attempt
    assert any(code == -signal.SIGKILL for _, _, code, _ in kills), kills

    done = subprocess.run(resume, env=env, capture_output=True, text=True, timeout=900)
    with EpisodeStore.open(out, create=False) as store:
        audit = store.audit()
    record_fault(
        "SIGKILL of a training script at random moments",
        injected=len(kills),
        survived=len(kills) * int(done.returncode == 0 and audit["ok"]),
        lost=len(audit["lost"]),
        trained_twice=len(audit["trained_twice"]),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert audit["ok"], (audit["lost"][:5], audit["trained_twice"][:5])
    assert "resumed at step" in done.stdout
    with EpisodeStore.open(out, create=False) as store:
        assert store.integrity_check() == "ok"
        consumed = store.consumed()
        steps = sorted({c["step"] for c in consumed})
        assert steps == list(range(1, STEPS + 1)), (steps, kills)
        by_task: dict[str, set[int]] = {}
        for c in consumed:
            by_task.setdefault(c["task_id"], set()).add(c["step"])
        assert all(len(s) == 1 for s in by_task.values()), "a task was trained twice"
        assert len(by_task) == STEPS * GROUPS_PER_STEP
        per_step = {s: sum(1 for t in by_task.values() if s in t) for s in steps}
        assert set(per_step.values()) == {GROUPS_PER_STEP}, per_step
        # the task stream has no gaps: every seed up to the last admitted one is recorded
        # (trained, complete or pending with its episodes in the store; a resume goes on)
        seeds = sorted(t.seed for t in store.tasks())
        assert seeds == list(range(len(seeds))), "a task was skipped"
        # no unfinished episode vanished: each ended, or is still resumable
        ended = {r["episode_id"] for r in store.episodes(state=["finished", "truncated"])}
        resumable = {p.episode_id for p in store.partials()}
        dropped = set(seen_partials) - ended - resumable
        assert not dropped, f"lost unfinished episodes: {sorted(dropped)[:5]}"
    from agentrl.trainer.checkpoint import latest_checkpoint

    checkpoint = latest_checkpoint(out / "checkpoints")
    assert checkpoint is not None and checkpoint.name == f"step-{STEPS:06d}"
    print(
        f"\nkills (attempt, delay s, return code, steps in store): {kills}; "
        f"{len(seen_partials)} unfinished episodes seen after kills"
    )
