"""A Python executor in a subprocess sandbox.

Each call runs the code in a fresh ``python -I`` process with:

* a fresh temporary working directory (deleted afterwards) as cwd and ``HOME``;
* an environment stripped to ``PATH`` and ``LANG`` (no secrets from the parent);
* rlimits: CPU seconds, address space (memory), file size, open files, and the
  number of processes (binding for unprivileged users; root ignores it);
* an audit hook (PEP 578) installed before the user's code, which cannot remove it,
  that refuses writes outside the working directory, sockets (no network), fork,
  starting programs, signals and ctypes;
* a wall-clock deadline, after which the whole process group is killed;
* captured output capped at ``max_output_bytes``.

Every failure comes back as text for the model; nothing here raises into the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import resource
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

# Runs first inside the child: the guard cannot be removed once installed.
_PRELUDE = r"""
import os, sys
_root = os.path.realpath(os.getcwd())
_PATH_EVENTS = {"os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.chmod": 1, "os.chown": 1,
                "os.truncate": 1, "os.utime": 1, "os.rename": 2, "os.link": 2, "os.symlink": 2}
_REFUSED = {"os.fork", "os.forkpty", "subprocess.Popen", "os.system", "os.exec",
            "os.posix_spawn", "os.spawn", "os.kill", "os.killpg", "ctypes.dlopen", "os.putenv",
            "socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo"}
def _inside(path):
    if isinstance(path, int):
        return True
    real = os.path.realpath(os.fsdecode(path))
    return real == _root or real.startswith(_root + os.sep)
_own_proc = f"/proc/{os.getpid()}/"
def _guard(event, args):
    if event == "open" and isinstance(args[0], (str, bytes)):
        name = os.path.realpath(os.fsdecode(args[0]))
        if name.startswith("/proc/") and name[6:7].isdigit() and not name.startswith(_own_proc):
            raise PermissionError(f"sandbox: reading other processes is not allowed: {name}")
    if event == "open":
        mode = args[1] or "r"
        writes = any(c in str(mode) for c in "wax+") if isinstance(mode, str) else bool(args[2] & 3)
        if writes and args[0] is not None and not _inside(args[0]):
            raise PermissionError(f"sandbox: writing outside the working directory: {args[0]}")
    elif event in _PATH_EVENTS:
        for path in args[: _PATH_EVENTS[event]]:
            if isinstance(path, (str, bytes, os.PathLike)) and not _inside(path):
                raise PermissionError(f"sandbox: {event} outside the working directory: {path}")
    elif event in _REFUSED:
        raise PermissionError(f"sandbox: {event} is not allowed")
sys.addaudithook(_guard)
del _guard
"""


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Resource limits of one sandboxed run."""

    wall_s: float = 10.0
    cpu_s: int = 5
    memory_bytes: int = 512 * 2**20
    max_processes: int = 8
    max_file_bytes: int = 16 * 2**20
    max_output_bytes: int = 16_384


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxResult:
    """Exit status and captured output of one run."""

    returncode: int | None
    output: str
    timed_out: bool = False
    output_truncated: bool = False

    def as_text(self) -> str:
        notes = []
        if self.timed_out:
            notes.append("Error: killed after the wall-clock limit")
        elif self.returncode is not None and self.returncode < 0:
            notes.append(f"Error: killed by signal {signal.Signals(-self.returncode).name}")
        elif self.returncode:
            notes.append(f"(exit code {self.returncode})")
        if self.output_truncated:
            notes.append("(output truncated)")
        return "\n".join([self.output.rstrip(), *notes]).strip() or "(no output)"


def _limit(limits: SandboxLimits) -> Callable[[], None]:
    def apply() -> None:  # runs in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_bytes, limits.max_file_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        # Binds for unprivileged users (root ignores it; the audit hook refuses fork there).
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))

    return apply


async def run_python(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` in the sandbox and return its status and (capped) output."""
    limits = limits or SandboxLimits()
    with tempfile.TemporaryDirectory(prefix="agentrl-sandbox-") as workdir:
        script = Path(workdir) / "main.py"
        script.write_text(_PRELUDE + "\n" + code)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-B", str(script),
            cwd=workdir,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_limit(limits),
        )  # fmt: skip
        output, truncated, timed_out = bytearray(), False, False
        try:
            async with asyncio.timeout(limits.wall_s):
                assert proc.stdout is not None
                while chunk := await proc.stdout.read(65536):
                    room = limits.max_output_bytes - len(output)
                    output += chunk[: max(room, 0)]
                    if len(chunk) > room:
                        truncated = True
                        break
                if not truncated:
                    await proc.wait()
        except TimeoutError:
            timed_out = True
        finally:
            _kill_group(proc.pid)
            with contextlib.suppress(ProcessLookupError):
                await proc.wait()
        return SandboxResult(
            returncode=None if timed_out or truncated else proc.returncode,
            output=output.decode("utf-8", errors="replace"),
            timed_out=timed_out,
            output_truncated=truncated,
        )


def _kill_group(pgid: int) -> None:
    """Kill the child's process group (the child and anything it forked)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def python(code: str) -> str:
    """Run Python code in a sandbox and return what it printed.

    Args:
        code: A complete Python program; use print() to show results.
    """
    result = await run_python(code)
    return result.as_text()
