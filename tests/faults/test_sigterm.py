"""Stopped by a job scheduler: SIGTERM at three moments, SIGKILL, nothing left running.

For each inference mode (vLLM in the process; `vllm serve` started by agentrl), one run
is stopped with SIGTERM three times, from fault points inside the process so that the
moment is exact: right after tokens were sampled, with the engine paused for a weight
update, and between the backward pass and the optimizer step. Each time the run must
stop cleanly within its grace period (no "stopping at once"), exit with 143 and print
the resume command, and leave no process behind (every process the run started
carries a marker in its environment; none may remain). The store passes the audit
after each stop, and the last ``--resume`` finishes the run with every task trained
exactly once.

A SIGKILLed `agentrl train` cannot clean up: there the watchdog must stop its
`vllm serve` and the server's engine process within seconds.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from agentrl.config.sections import JobConfig
from tests.faults.harness import (
    AGENTRL,
    Proc,
    agentrl_env,
    audit,
    consumed_steps,
    digits_config,
    wait_until,
)

STEPS = 6
STOPS = ["generation@40", "weight_update@2", "optimizer_step@2"]
MARK = "AGENTRL_TEST_RUN_MARK"


def _marked(mark: str) -> dict[int, str]:
    """Live processes whose environment carries ``MARK=mark``: PID -> command line."""
    found = {}
    needle = f"{MARK}={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z":
            found[int(entry.name)] = cmd[:120]
    return found


def _nothing_left(mark: str, within_s: float) -> dict[int, str]:
    deadline = time.monotonic() + within_s
    while (left := _marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _sigterm_three_times_then_resume(
    tmp_path: Path, model_cache: Path, mode: str, record_fault: Any
) -> None:
    run_dir, config = tmp_path / "run", digits_config(tmp_path, steps=STEPS)
    grace = JobConfig().stop_grace_s  # the default a job scheduler meets (25 s)
    audits, stops = [], []
    for i, fault in enumerate(STOPS):
        mark = uuid.uuid4().hex
        env = agentrl_env(model_cache, AGENTRL_FAULTS=f"{fault}=TERM", **{MARK: mark})
        args = (
            [AGENTRL, "train", str(config), f'--run.out="{run_dir}"', f'--inference.mode="{mode}"']
            if i == 0
            else [AGENTRL, "train", "--resume", str(run_dir)]
        )
        proc = Proc(args, tmp_path / f"stop-{i}.log", env)
        wait_until(
            lambda p=proc: "fault injection: SIGTERM" in p.text() or p.poll() is not None,
            "the SIGTERM",
            600,
        )
        signalled = time.monotonic()
        rc = proc.proc.wait(grace + 30)
        stops.append(time.monotonic() - signalled)
        left = _nothing_left(mark, 10)
        point = fault.split("@")[0]
        try:
            assert rc == 143, f"stop {i} ({point}) ended with {rc}:\n{proc.tail()}"
            assert "stopping at once" not in proc.text(), proc.tail()
            assert f"stopped by SIGTERM; continue with: agentrl train --resume {run_dir}" in (
                proc.text()
            ), proc.tail()
            assert not left, f"still running after stop {i} ({point}): {left}"
        finally:
            proc.kill()
        audits.append(audit(run_dir))
        assert audits[-1]["ok"] and audits[-1]["integrity"] == "ok", audits[-1]
    final = Proc(
        [AGENTRL, "train", "--resume", str(run_dir)],
        tmp_path / "final.log",
        agentrl_env(model_cache),
    )
    rc = final.wait(900)
    end = audit(run_dir)
    lost = len(end["lost"]) + sum(len(a["lost"]) for a in audits)
    twice = len(end["trained_twice"]) + sum(len(a["trained_twice"]) for a in audits)
    for fault, took in zip(STOPS, stops, strict=True):
        record_fault(
            f"SIGTERM of `agentrl train` ({mode} mode) at {fault.split('@')[0]}: "
            f"stopped in {took:.1f} s",
            injected=1,
            survived=int(rc == 0 and end["ok"]),
            lost=lost,
            trained_twice=twice,
        )
    assert rc == 0, final.tail()
    assert lost == 0 and twice == 0, (end["lost"], end["trained_twice"])
    assert end["consumed_steps"] == STEPS and end["trained_tasks"] == STEPS * 4
    assert max(stops) < grace, stops


@pytest.mark.vllm
@pytest.mark.timeout(1800)
# Both modes in `make soak` only (about 3 minutes each on 2 cores): `make test` pays for
# the browser, docs and export tests with them.
@pytest.mark.soak
@pytest.mark.parametrize("mode", ["engine", "server"])
def test_sigterm_at_three_moments_stops_cleanly_then_resume_finishes(
    tmp_path: Path, model_cache: Path, mode: str, record_fault: Any
) -> None:
    _sigterm_three_times_then_resume(tmp_path, model_cache, mode, record_fault)


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_sigkilled_train_leaves_no_vllm_serve_behind(
    tmp_path: Path, model_cache: Path, record_fault: Any
) -> None:
    """SIGKILL to the `agentrl train` process alone (not its group): its watchdog stops
    the `vllm serve` it started (own session) and the server's engine process."""
    run_dir, config = tmp_path / "run", digits_config(tmp_path, steps=50)
    mark = uuid.uuid4().hex
    proc = Proc(
        [AGENTRL, "train", str(config), f'--run.out="{run_dir}"', '--inference.mode="server"'],
        tmp_path / "train.log",
        agentrl_env(model_cache, **{MARK: mark}),
    )
    try:
        wait_until(lambda: consumed_steps(run_dir) >= 1, "a step", 600, proc)
        running = _marked(mark)
        assert any("vllm" in cmd for cmd in running.values()), running
        os.kill(proc.pid, 9)
        assert proc.proc.wait(10) == -9
        t0 = time.monotonic()
        left = _nothing_left(mark, 15)
        took = time.monotonic() - t0
        record_fault(
            f"SIGKILL of `agentrl train` (server mode): its processes gone in {took:.1f} s",
            injected=1,
            survived=int(not left),
            lost=0,
        )
        assert not left, f"still running 15 s after the SIGKILL: {left}"
        assert audit(run_dir)["integrity"] == "ok"
    finally:
        proc.kill()


@pytest.mark.soak
@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_sigterm_stops_a_rollout_cleanly_then_resume_finishes(
    tmp_path: Path, model_cache: Path, record_fault: Any
) -> None:
    """`agentrl rollout` stops on SIGTERM like on Ctrl-C; --resume records the rest."""
    import sqlite3

    out, mark = tmp_path / "rollout", uuid.uuid4().hex
    env = agentrl_env(model_cache, AGENTRL_FAULTS="generation@30=TERM", **{MARK: mark})
    proc = Proc(
        [
            AGENTRL,
            "rollout",
            "agentrl/GuessNumber-v0",
            "--episodes",
            "24",
            "--group-size",
            "2",
            "--concurrency",
            "8",
            "--max-tokens",
            "32",
            "--out",
            str(out),
        ],
        tmp_path / "rollout.log",
        env,
    )
    try:
        rc = proc.proc.wait(600)
        left = _nothing_left(mark, 10)
        assert rc == 143, proc.tail()
        assert f"continue with: agentrl rollout --resume --out {out}" in proc.text()
        assert not left, left
    finally:
        proc.kill()
    again = Proc(
        [AGENTRL, "rollout", "--resume", "--out", str(out)],
        tmp_path / "resume.log",
        agentrl_env(model_cache),
    )
    assert again.wait(600) == 0, again.tail()
    from agentrl.store.schema import FINAL_STATES

    conn = sqlite3.connect(out / "episodes.db")
    try:
        finished = conn.execute(
            f"SELECT COUNT(DISTINCT episode_id) FROM episodes WHERE origin = 'run' AND state IN "
            f"({', '.join('?' * len(FINAL_STATES))})",
            FINAL_STATES,
        ).fetchone()[0]
    finally:
        conn.close()
    report = audit(out)
    survived = int(finished == 24 and report["ok"])
    record_fault(
        "SIGTERM of `agentrl rollout` at generation",
        injected=1,
        survived=survived,
        lost=len(report["lost"]),
    )
    assert report["ok"] and not report["lost"], report
    assert finished == 24, finished


@pytest.mark.soak
@pytest.mark.vllm
@pytest.mark.timeout(900)
@pytest.mark.parametrize("signum", [15, 9], ids=["SIGTERM", "SIGKILL"])
def test_agentrl_serve_leaves_nothing_behind(
    tmp_path: Path, model_cache: Path, record_fault: Any, signum: int
) -> None:
    """`agentrl serve` becomes `vllm serve` (exec): SIGTERM is vLLM's graceful shutdown;
    after a SIGKILL the watchdog started before the exec stops the engine process."""
    import urllib.request

    from agentrl.runtime.net import free_port

    port, mark = free_port(), uuid.uuid4().hex
    proc = Proc(
        [AGENTRL, "serve", str(digits_config(tmp_path)), "--port", str(port)],
        tmp_path / "serve.log",
        agentrl_env(model_cache, **{MARK: mark}),
    )

    def up() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        wait_until(up, "vllm serve up", 600, proc)
        assert len(_marked(mark)) >= 2, _marked(mark)  # the server and its engine
        t0 = time.monotonic()
        os.kill(proc.pid, signum)
        proc.proc.wait(60)
        left = _nothing_left(mark, 15)
        took = time.monotonic() - t0
        name = {15: "SIGTERM", 9: "SIGKILL"}[signum]
        record_fault(
            f"{name} of `agentrl serve`: its processes gone in {took:.1f} s",
            injected=1,
            survived=int(not left),
            lost=0,
        )
        assert not left, f"still running 15 s after the {name}: {left}"
    finally:
        proc.kill()
