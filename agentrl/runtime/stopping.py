"""Stopping cleanly: SIGTERM and SIGHUP like Ctrl-C, and no process left behind.

Job schedulers (SLURM, Kubernetes, systemd) stop a job with SIGTERM and, after a grace
period, SIGKILL. Two pieces make agentrl's long-running commands survive both:

* :func:`run_stoppable` runs a command's coroutine like :func:`asyncio.run`, with
  SIGTERM and SIGHUP doing what Ctrl-C does: the main task is cancelled, so every
  ``finally`` and exit stack runs (admission stops, the store is flushed, servers and
  engines are stopped) and :class:`Stopped` is raised for the command to print the
  resume command and exit with ``128 + signal``. A second signal, or the grace period
  running out, stops at once: every process this one started is killed and the
  process exits. The store is SQLite in WAL mode, so an exit at any instant leaves
  it consistent (the fault suite's SIGKILL rows prove it).
* :func:`ensure_reaper` starts a watchdog process that outlives this one by design:
  when this process dies, by any means including SIGKILL, the watchdog kills every
  process it had started (``vllm serve`` and its engine processes, the in-process
  engine's workers, sandboxes, test subprocesses): SIGTERM first, SIGKILL after three
  seconds. It knows them from a scan of
  ``/proc`` once a second and identifies each by PID *and* start time, so a PID
  reused by an unrelated process is never touched. Linux only; elsewhere it is a
  no-op.

This module imports only the standard library.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
SCAN_INTERVAL_S = 1.0
SETTLE_S = 1.0
"""After the watched process exits, how long its descendants get to end by themselves."""


class Stopped(KeyboardInterrupt):
    """The command was stopped by a signal and cleaned up; ``exit_code`` is 128 + it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {self.name}")


# ---------------------------------------------------------------------------------
# The process tree, from /proc


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent PID, start time in clock ticks since boot) of ``pid``; None if it has
    ended (a zombie has too: only its exit status is left to collect)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[19])  # ppid; starttime (field 22 of stat)


def _parents() -> dict[int, tuple[int, int]]:
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            table[int(entry.name)] = stat
    return table


def descendants(pid: int) -> dict[int, int]:
    """Every live descendant of ``pid``: PID -> start time (Linux ``/proc``)."""
    table = _parents()
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, stack = {}, [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found[child] = table[child][1]
            stack.append(child)
    return found


def _targets(known: dict[int, int]) -> dict[int, int]:
    """The PIDs of ``known`` still running with the recorded start time, and their
    descendants."""
    targets = {}
    for pid, started in known.items():
        stat = _stat(pid)
        if stat is not None and stat[1] == started:
            targets[pid] = started
            targets.update(descendants(pid))
    return targets


def kill_processes(known: dict[int, int], *, sig: int = signal.SIGKILL) -> list[int]:
    """Send ``sig`` to each PID of ``known`` still running with the same start time,
    and to everything those started; returns the PIDs signalled."""
    hit = []
    for pid in _targets(known):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
            hit.append(pid)
    return hit


def stop_processes(known: dict[int, int], grace_s: float = 3.0) -> list[int]:
    """SIGTERM (``vllm serve`` shuts its engine down; multiprocessing's resource
    tracker gets to unlink shared memory), then after ``grace_s`` SIGKILL whatever of
    them (or of what they started meanwhile) still runs; returns the PIDs stopped."""
    targets = _targets(known)
    hit = kill_processes(targets, sig=signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _targets(targets):
        time.sleep(0.1)
    return sorted({*hit, *kill_processes(targets)})


# ---------------------------------------------------------------------------------
# The watchdog: nothing this process started outlives it

_reaper: tuple[int, subprocess.Popen[bytes]] | None = None
_reaper_lock = threading.Lock()


def ensure_reaper() -> int | None:
    """Start (once per process) the watchdog that kills this process's descendants
    when it dies; returns the watchdog's PID (None where /proc is missing)."""
    global _reaper
    if not Path("/proc/self/stat").exists():
        return None
    with _reaper_lock:
        if _reaper is not None and _reaper[0] == os.getpid() and _reaper[1].poll() is None:
            return _reaper[1].pid
        # Its own session: a kill of this process's group (Ctrl-C, kill -PGID) spares it.
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentrl.runtime.stopping", "--watch", str(os.getpid())],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        _reaper = (os.getpid(), proc)
        return proc.pid


def _wait_for_exit(pid: int, timeout_s: float, pidfd: int | None) -> bool:
    """Whether ``pid`` exited within ``timeout_s``."""
    if pidfd is not None:
        return bool(select.select([pidfd], [], [], timeout_s)[0])
    time.sleep(timeout_s)
    return os.getppid() != pid  # re-parented: the parent is gone


def watch(parent: int, interval_s: float = SCAN_INTERVAL_S) -> int:
    """The watchdog's loop: remember ``parent``'s descendants; when it exits, kill them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        pidfd: int | None = os.pidfd_open(parent)
    except (AttributeError, OSError):
        pidfd = None
    if os.getppid() != parent:
        return 0  # the parent died before we started; nothing of it is known
    me = os.getpid()
    known: dict[int, int] = {}
    while True:
        current = descendants(parent)
        current.pop(me, None)
        known.update(current)
        if _wait_for_exit(parent, interval_s, pidfd):
            break
        # Forget the ones that ended on their own (their PIDs may be reused).
        known = {p: s for p, s in known.items() if (st := _stat(p)) and st[1] == s}
    known.pop(me, None)
    names = {pid: _name(pid) for pid in known}
    # What ends by itself once its parent is gone is neither stopped nor reported:
    # multiprocessing's resource tracker reads EOF on its pipe, unlinks what was leaked
    # and exits, a moment after a clean exit.
    deadline = time.monotonic() + SETTLE_S
    while known and time.monotonic() < deadline:
        time.sleep(0.05)
        known = _targets(known)
    hit = stop_processes(known)
    if hit:
        listed = ", ".join(f"{pid} {names.get(pid) or _name(pid)}" for pid in sorted(hit)[:8])
        sys.stderr.write(
            f"agentrl: process {parent} ended; stopped {len(hit)} process(es) it had "
            f"started ({listed}{', ...' if len(hit) > 8 else ''})\n"
        )
    return 0


def _name(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    return " ".join(a.decode(errors="replace") for a in argv[:4] if a)[:80]


# ---------------------------------------------------------------------------------
# SIGTERM and SIGHUP like Ctrl-C, with a grace period


class _StopState:
    def __init__(self, grace_s: float, on_hard_stop: Callable[[str], None] | None) -> None:
        self.grace_s = grace_s
        self.on_hard_stop = on_hard_stop
        self.signum: int | None = None
        self.timer: threading.Timer | None = None

    def on_signal(self, signum: int, task: asyncio.Task[Any]) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            self.hard_stop(signum, f"a second signal ({name})")
            return
        self.signum = signum
        # The second signal must work even while the loop is blocked in a cleanup that
        # does not return: a plain handler runs in the main thread between bytecodes.
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
            signal.signal(sig, self._again)
        sys.stderr.write(
            f"\nagentrl: {name} received; stopping cleanly (at most {self.grace_s:.0f} s; "
            f"send it again to stop at once)\n"
        )
        sys.stderr.flush()
        self.timer = threading.Timer(
            self.grace_s, self.hard_stop, (signum, f"the grace period ({self.grace_s:.0f} s)")
        )
        self.timer.daemon = True
        self.timer.start()
        task.cancel(f"stopped by {name}")

    def _again(self, signum: int, frame: object) -> None:
        self.hard_stop(signum, f"a second signal ({signal.Signals(signum).name})")

    def hard_stop(self, signum: int, why: str) -> None:
        """Kill what this process started and exit now (the store stays consistent)."""
        sys.stderr.write(f"agentrl: {why} ended the clean stop; stopping at once\n")
        if self.on_hard_stop is not None:
            # the process is killed next: a failing hook must not keep it from stopping
            with contextlib.suppress(Exception):
                self.on_hard_stop(why)
        sys.stderr.flush()
        mine = descendants(os.getpid())
        if _reaper is not None:
            mine.pop(_reaper[1].pid, None)  # it exits by itself once we are gone
        kill_processes(mine)
        os._exit(128 + (self.signum or signum))


def run_stoppable(
    coro: Coroutine[Any, Any, T],
    *,
    grace_s: float = 25.0,
    on_hard_stop: Callable[[str], None] | None = None,
) -> T:
    """:func:`asyncio.run` with SIGTERM and SIGHUP handled like Ctrl-C.

    The first SIGTERM/SIGHUP cancels the coroutine (its cleanup runs) and this raises
    :class:`Stopped`; a second one, or ``grace_s`` seconds without finishing, kills the
    process's children and exits at once with ``128 + signal`` after calling
    ``on_hard_stop(why)`` (for example to print the resume command). Ctrl-C keeps
    asyncio's own handling (:class:`KeyboardInterrupt`).
    """
    state = _StopState(grace_s, on_hard_stop)
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

    async def main() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, state.on_signal, sig, task)
        try:
            return await coro
        finally:
            if state.signum is None:
                for sig in STOP_SIGNALS:
                    loop.remove_signal_handler(sig)

    try:
        result = asyncio.run(main())
    except BaseException as e:
        if state.signum is None or isinstance(e, KeyboardInterrupt | SystemExit):
            raise
        # Whatever the cancellation turned into on its way out, the run was stopped.
        raise Stopped(state.signum) from (None if isinstance(e, asyncio.CancelledError) else e)
    finally:
        if state.timer is not None:
            state.timer.cancel()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if state.signum is not None:  # the coroutine swallowed the cancellation
        raise Stopped(state.signum)
    return result


def _main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "--watch":
        sys.stderr.write("usage: python -m agentrl.runtime.stopping --watch PID\n")
        return 2
    return watch(int(argv[1]))


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

__all__ = [
    "Stopped",
    "descendants",
    "ensure_reaper",
    "kill_processes",
    "run_stoppable",
    "stop_processes",
    "watch",
]
