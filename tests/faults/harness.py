"""Helpers for whole-run fault tests: `agentrl` subprocesses, waiting, the audit."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from agentrl.store import EpisodeStore

AGENTRL = str(Path(sys.executable).parent / "agentrl")

DIGITS = """
[run]
name = "faults"
[env]
id = "agentrl/Digits-v0"
[rollout]
group_size = 8
concurrency = 32
max_turns = 1
max_tokens_per_turn = 16
[trainer]
lr = 3e-3
[train]
steps = {steps}
groups_per_step = 4
checkpoint_every = 1
[eval]
episodes = 0
[log]
progress = "plain"
plots = false
"""


def digits_config(tmp_path: Path, steps: int = 8) -> Path:
    path = tmp_path / "digits.toml"
    path.write_text(DIGITS.format(steps=steps))
    return path


class Proc:
    """An `agentrl ...` (or any) subprocess in its own session, output in a log file.

    Its whole process group is ended when it ends (a SIGKILLed `agentrl train` leaves
    vLLM's engine process behind in its group) and at the end of the test (the
    ``_end_test_processes`` fixture), whatever happened.
    """

    live: ClassVar[list[Proc]] = []

    def __init__(self, args: Sequence[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                list(args), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        Proc.live.append(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout_s: float) -> int:
        try:
            rc = self.proc.wait(timeout_s)
            self._end_group()
            return rc
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.log_path.name}: still running after {timeout_s} s; log ends:\n{self.tail()}"
            ) from None

    def kill(self) -> None:
        """SIGKILL the whole process group (the process and every child it started)."""
        self._end_group()
        self.proc.wait()
        self._end_group()

    def _end_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 25) -> str:
        return "\n".join(self.text().splitlines()[-lines:])


def wait_until(
    predicate: Callable[[], bool], what: str, timeout_s: float = 300.0, proc: Proc | None = None
) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(
                f"the process exited ({proc.poll()}) before {what}; log ends:\n{proc.tail()}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


def consumed_steps(run_dir: Path) -> int:
    """The last optimizer step recorded in the store (-1: none, or not readable yet)."""
    db = run_dir / "episodes.db"
    if not db.exists():
        return -1
    conn = sqlite3.connect(db, timeout=5)
    try:
        return conn.execute("SELECT COALESCE(MAX(step), -1) FROM consumed").fetchone()[0]
    except sqlite3.OperationalError:
        return -1
    finally:
        conn.close()


def audit(run_dir: Path) -> dict[str, Any]:
    with EpisodeStore.open(run_dir, create=False) as store:
        return {"integrity": store.integrity_check(), **store.audit()}


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def agentrl_env(model_cache: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "AGENTRL_CACHE": str(model_cache), **extra}
    env.pop("AGENTRL_FAULTS", None)
    env.update(extra)
    return env
