"""Stopping cleanly (agentrl.runtime.stopping): SIGTERM/SIGHUP like Ctrl-C with a grace period,
and the watchdog that stops whatever a process started when it dies, even by SIGKILL."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agentrl.runtime.stopping import descendants, kill_processes, stop_processes

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended


def _wait(predicate, timeout_s: float = 15.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _script(tmp_path: Path, body: str) -> subprocess.Popen[str]:
    path = tmp_path / "prog.py"
    path.write_text(textwrap.dedent(body))
    return subprocess.Popen(
        [sys.executable, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=tmp_path,
    )


def _ready(proc: subprocess.Popen[str]) -> list[int]:
    """The PIDs the program prints on its first line once it is set up."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ready"), (line, proc.stderr.read() if proc.stderr else "")
    return [int(p) for p in line.split()[1:]]


SPAWNER = """
    import subprocess, sys, time
    from agentrl.runtime.stopping import ensure_reaper
    reaper = ensure_reaper()
    sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
    # like vllm serve: its own session, with a child of its own (the engine process)
    server = subprocess.Popen([sys.executable, "-c",
        "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(120)",
        *sleep], start_new_session=True)
    # like vLLM's in-process engine: a plain child in our group
    engine = subprocess.Popen(sleep)
    time.sleep(2.5)  # two watchdog scans
    print("ready", reaper, server.pid, engine.pid, flush=True)
    time.sleep(120)
"""


def test_sigkilled_process_leaves_nothing_it_started(tmp_path: Path) -> None:
    """SIGKILL (no cleanup possible): the watchdog stops the server, the server's own
    child and the plain child within seconds, then exits itself."""
    proc = _script(tmp_path, SPAWNER)
    try:
        reaper, server, engine = _ready(proc)
        started = descendants(proc.pid)
        assert {server, engine} <= set(started) and reaper in started
        grandchild = next(p for p in descendants(server))
        os.kill(proc.pid, signal.SIGKILL)  # the process only, as `kill -9 PID` does
        proc.wait(5)
        for pid in (server, engine, grandchild):
            assert _wait(lambda p=pid: not _alive(p)), f"{pid} outlived its SIGKILLed parent"
        assert _wait(lambda: not _alive(reaper)), "the watchdog did not exit"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


CLEAN_EXIT = """
    import multiprocessing.resource_tracker as rt, subprocess, sys, time
    from agentrl.runtime.stopping import ensure_reaper
    reaper = ensure_reaper()
    rt.ensure_running()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    time.sleep(2.5)  # two watchdog scans
    print("ready", reaper, rt._resource_tracker._pid, child.pid, flush=True)
"""


def test_what_ends_by_itself_after_a_clean_exit_is_not_reported(tmp_path: Path) -> None:
    """multiprocessing's resource tracker exits by itself once its parent has: the
    watchdog lets it, and names only what it had to stop (here a sleeping child)."""
    proc = _script(tmp_path, CLEAN_EXIT)
    try:
        reaper, tracker, child = _ready(proc)
        assert proc.wait(10) == 0
        assert proc.stderr is not None
        stderr = proc.stderr.read()  # the watchdog writes to it; EOF once it has exited
        assert _wait(lambda: not any(map(_alive, (reaper, tracker, child))))
        assert f"stopped 1 process(es) it had started ({child} " in stderr, stderr
        assert "resource_tracker" not in stderr and str(tracker) not in stderr, stderr
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_kill_processes_spares_a_reused_pid() -> None:
    """A PID is killed only while it still has the start time that was recorded."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = descendants(os.getpid())[child.pid]
        assert kill_processes({child.pid: started + 1}) == [], "another start time: spared"
        assert child.poll() is None
        assert kill_processes({child.pid: started}) == [child.pid]
        assert child.wait(5) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()


def test_stop_processes_asks_first_then_kills(tmp_path: Path) -> None:
    """SIGTERM lets a process clean up (vllm serve, the resource tracker); one that
    ignores it is SIGKILLed after the grace period."""
    polite = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import signal, sys, time
        def bye(*_):
            open({str(tmp_path / "bye")!r}, "w").write("cleaned up")
            sys.exit(0)
        signal.signal(signal.SIGTERM, bye)
        print("ready", flush=True)
        time.sleep(60)"""),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for proc in (polite, stubborn):
            assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
        mine = descendants(os.getpid())
        known = {p.pid: mine[p.pid] for p in (polite, stubborn)}
        t0 = time.monotonic()
        assert stop_processes(known, grace_s=1.0) == sorted(known)
        assert 0.9 < time.monotonic() - t0 < 5
        assert polite.wait(5) == 0 and (tmp_path / "bye").read_text() == "cleaned up"
        assert stubborn.wait(5) == -signal.SIGKILL
    finally:
        for proc in (polite, stubborn):
            proc.kill()
            proc.wait()


STOPPABLE = """
    import asyncio, signal, subprocess, sys, time
    from agentrl.runtime.stopping import Stopped, run_stoppable

    HANG = {hang}

    async def job():
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        print("ready", child.pid, flush=True)
        try:
            await asyncio.sleep(120)
        finally:
            if HANG:  # a cleanup that never ends
                time.sleep(120)
            child.terminate()
            child.wait()
            open("cleaned", "w").write("yes")

    try:
        run_stoppable(job(), grace_s={grace},
                      on_hard_stop=lambda why: print("hard stop:", why, flush=True))
    except Stopped as e:
        print("stopped", e.name, flush=True)
        sys.exit(e.exit_code)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_like_ctrl_c(tmp_path: Path, sig: signal.Signals) -> None:
    """The coroutine is cancelled, its cleanup runs, and the exit status is 128 + signal."""
    proc = _script(tmp_path, STOPPABLE.format(hang=False, grace=30))
    (child,) = _ready(proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 128 + sig, (out, err)
    assert f"stopped {sig.name}" in out
    assert f"{sig.name} received; stopping cleanly" in err
    assert (tmp_path / "cleaned").read_text() == "yes", "the cleanup did not run"
    assert not _alive(child)


def test_a_second_sigterm_stops_at_once(tmp_path: Path) -> None:
    """A cleanup that hangs: the second signal kills the children and exits now."""
    proc = _script(tmp_path, STOPPABLE.format(hang=True, grace=300))
    (child,) = _ready(proc)
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    assert proc.poll() is None, "the first signal only starts the clean stop"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=10)
    assert time.monotonic() - t0 < 5
    assert proc.returncode == 128 + signal.SIGTERM, (out, err)
    assert "hard stop: a second signal (SIGTERM)" in out
    assert not (tmp_path / "cleaned").exists()
    assert _wait(lambda: not _alive(child)), "the child outlived the hard stop"


def test_the_grace_period_running_out_stops_at_once(tmp_path: Path) -> None:
    proc = _script(tmp_path, STOPPABLE.format(hang=True, grace=1.5))
    (child,) = _ready(proc)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=15)
    assert 1.4 < time.monotonic() - t0 < 10
    assert proc.returncode == 128 + signal.SIGTERM, (out, err)
    assert "hard stop: the grace period (2 s)" in out or "hard stop: the grace period" in out
    assert _wait(lambda: not _alive(child))


def test_fault_points_can_send_a_signal_instead_of_sigkill() -> None:
    from agentrl.runtime import faults

    try:
        faults.arm("generation@2=TERM,optimizer_step")
        assert faults._armed == {
            "generation": (2, signal.SIGTERM),
            "optimizer_step": (1, signal.SIGKILL),
        }
        with pytest.raises(ValueError, match="the signal after = must be one of"):
            faults.arm("generation@2=STOP")
    finally:
        faults.arm("")
