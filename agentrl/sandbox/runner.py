"""Running one program in the sandbox: choosing the mechanism, the deadline, the output.

:func:`resolve` turns a :class:`SandboxPolicy` into the mechanism in force: it tries
each mechanism once per process with a trivial program (``bwrap``, then ``unshare``),
logs which one it uses and why the others failed, and raises
:class:`SandboxUnavailableError` when the policy demands OS isolation (the default) that
this machine cannot give, naming what to install and how to allow the weaker mode.
:func:`mark_tool` and :func:`tool_policy` let a tool say that it runs model-written code
and under which policy (``agentrl check-env`` reports it). :func:`run_python` starts the
run in a new session, writes the program to its stdin, keeps at most
``max_output_bytes`` of its output and, at the deadline or when the output is cut,
kills the whole process group; the mechanisms' PID namespaces take everything inside
down with their first process. Nothing here raises for a failing program: its failure
is the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable
from typing import Any, TypeVar, cast, get_args

from agentrl.sandbox.inside import ARCHES as SECCOMP_ARCHES
from agentrl.sandbox.isolation import command
from agentrl.sandbox.limits import (
    ENV_VAR,
    MECHANISMS,
    OS_MECHANISMS,
    IsolationChoice,
    Mechanism,
    SandboxLimits,
    SandboxPolicy,
    SandboxResult,
    SandboxUnavailableError,
)

logger = logging.getLogger(__name__)

DESCRIPTIONS: dict[Mechanism, str] = {
    "bwrap": "bubblewrap: own user, mount, PID, network, IPC, UTS and cgroup namespaces, uid "
    "65534, no capabilities, read-only system, a size- and inode-limited tmpfs as the only "
    "writable place; seccomp, rlimits",
    "unshare": "unshare (util-linux): own user, mount, PID, network, IPC, UTS and cgroup "
    "namespaces, uid 65534, no capabilities, read-only system, a size- and inode-limited "
    "tmpfs as the only writable place; seccomp, rlimits",
    "process": "a plain child process: seccomp, rlimits, an audit hook and a stripped "
    "environment, but NO OS isolation: it can read what this user can read and write "
    "where this user can write",
}
INSTALL_HINT = (
    "install bubblewrap with the system package manager (Debian/Ubuntu: `apt-get install "
    "bubblewrap`, Fedora: `dnf install bubblewrap`; `make install` does it when run as "
    "root), or allow unprivileged user namespaces for util-linux `unshare` (`sysctl "
    "kernel.unprivileged_userns_clone=1`, `user.max_user_namespaces` > 0; on Ubuntu 24.04 "
    "also `kernel.apparmor_restrict_unprivileged_userns=0`)"
)
WEAKER_HINT = (
    f"To run it without OS isolation (weaker: the code can read what this user can read): "
    f"{ENV_VAR}=fallback (OS isolation where there is some, else a plain process) or "
    f"{ENV_VAR}=process, or isolation='fallback' in the tool's SandboxPolicy"
)
_PROBE_TIMEOUT_S = 30.0
_REAP_TIMEOUT_S = 10.0


TOOL_ATTRIBUTE = "agentrl_sandbox"
"""The attribute of a tool function that holds its :class:`SandboxPolicy`."""
ToolFn = TypeVar("ToolFn", bound=Callable[..., Any])


def mark_tool(fn: ToolFn, policy: SandboxPolicy) -> ToolFn:
    """Declare that the tool ``fn`` runs model-written code in the sandbox under
    ``policy``, so that ``agentrl check-env`` reports the mode it runs in here."""
    setattr(fn, TOOL_ATTRIBUTE, policy)
    return fn


def tool_policy(tool: object) -> SandboxPolicy | None:
    """The policy ``tool`` (a function, or an :class:`agentrl.tools.Tool` holding one as
    ``fn``) was marked with by :func:`mark_tool`; None for a tool that runs no code."""
    policy = getattr(getattr(tool, "fn", tool), TOOL_ATTRIBUTE, None)
    return policy if isinstance(policy, SandboxPolicy) else None


@functools.cache
def probe(mechanism: Mechanism) -> str | None:
    """None if ``mechanism`` runs a trivial program here, else why not (once per process)."""
    if mechanism != "process" and shutil.which(mechanism) is None:
        return f"{mechanism} is not installed"
    limits, policy = SandboxLimits(), SandboxPolicy(audit_hook=False)
    with tempfile.TemporaryDirectory(prefix="agentrl-sandbox-") as host_dir:
        cmd = command(mechanism, host_dir, limits, policy)
        try:
            done = subprocess.run(
                cmd.argv,
                cwd=cmd.cwd,
                env=cmd.env,
                input=b"print('sandbox ok')",
                capture_output=True,
                timeout=_PROBE_TIMEOUT_S,
                start_new_session=True,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"{mechanism} failed to start: {e}"
    if done.returncode == 0 and done.stdout.strip() == b"sandbox ok":
        return None
    said = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()
    return f"{mechanism} exited with {done.returncode}: {said[-1] if said else 'no output'}"


@functools.cache
def _announce(mechanism: Mechanism, failures: tuple[str, ...]) -> None:
    """Log once per process which mechanism runs model-written code, and why not a better
    one (``failures``: the probes that failed; empty when the mechanism was asked for)."""
    why = f" ({'; '.join(failures)})" if failures else ""
    if os.uname().machine not in SECCOMP_ARCHES:
        why += f" (no seccomp filter: no syscall table for {os.uname().machine})"
    if mechanism in OS_MECHANISMS:
        logger.info("sandbox: model-written code runs under %s%s", DESCRIPTIONS[mechanism], why)
    elif not failures:
        logger.warning("sandbox: model-written code runs as asked, as %s", DESCRIPTIONS[mechanism])
    else:
        logger.warning(
            "sandbox: no OS isolation available%s; model-written code runs, as isolation "
            "'fallback' allows, as %s. To fix: %s.",
            why,
            DESCRIPTIONS[mechanism],
            INSTALL_HINT,
        )


def resolve(policy: SandboxPolicy) -> Mechanism:
    """The mechanism ``policy`` gets on this machine (probing on first use).

    Raises:
        SandboxUnavailableError: the policy names a mechanism, or demands OS isolation
            (``os``, the default), that does not work here.
    """
    choice = _choice(policy)
    if choice in MECHANISMS:
        mechanism = cast(Mechanism, choice)
        failure = probe(mechanism)
        if failure is not None:
            raise SandboxUnavailableError(f"the sandbox asked for {choice}, which fails: {failure}")
        _announce(mechanism, ())
        return mechanism
    failures = []
    for mechanism in OS_MECHANISMS:
        failure = probe(mechanism)
        if failure is None:
            _announce(mechanism, tuple(failures))
            return mechanism
        failures.append(failure)
    if choice == "os":
        raise SandboxUnavailableError(
            f"no OS isolation for model-written code on this machine ({'; '.join(failures)}), "
            f"so the sandbox refuses to run it. To fix: {INSTALL_HINT}. {WEAKER_HINT}."
        )
    _announce("process", tuple(failures))
    return "process"


def _choice(policy: SandboxPolicy) -> IsolationChoice:
    """The policy's isolation; where it says ``auto``, ``$AGENTRL_SANDBOX`` or else ``os``."""
    if policy.isolation != "auto":
        return policy.isolation
    value = os.environ.get(ENV_VAR) or "os"
    if value == "auto" or value not in get_args(IsolationChoice):
        raise SandboxUnavailableError(
            f"{ENV_VAR}={value!r} is not a sandbox setting; "
            f"expected one of {list(get_args(IsolationChoice))[1:]}"
        )
    return cast(IsolationChoice, value)


async def run_python(code: str, limits: SandboxLimits, policy: SandboxPolicy) -> SandboxResult:
    """Run the Python program ``code`` in the sandbox; its status and (capped) output.

    Raises:
        SandboxUnavailableError: the isolation ``policy`` asks for is not available.
    """
    mechanism = await asyncio.to_thread(resolve, policy)
    # A process run may leave files it made unremovable (chmod 000); they go with /tmp.
    made = tempfile.TemporaryDirectory(prefix="agentrl-sandbox-", ignore_cleanup_errors=True)
    with made as host_dir:
        cmd = command(mechanism, host_dir, limits, policy)
        proc = await asyncio.create_subprocess_exec(
            *cmd.argv,
            cwd=cmd.cwd,
            env=cmd.env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        output, truncated, timed_out = bytearray(), False, False
        try:
            async with asyncio.timeout(limits.wall_s):
                await _feed(proc, code.encode())
                truncated = await _read_capped(proc, output, limits.max_output_bytes)
                if not truncated:
                    await proc.wait()
        except TimeoutError:
            timed_out = True
        finally:
            _kill_group(proc.pid)
            await _reap(proc)
    return SandboxResult(
        returncode=None if timed_out or truncated else _status(mechanism, proc.returncode),
        output=output.decode("utf-8", errors="replace"),
        timed_out=timed_out,
        output_truncated=truncated,
        mechanism=mechanism,
    )


def _status(mechanism: Mechanism, returncode: int | None) -> int | None:
    """The program's exit status as Popen gives it (-N: killed by signal N). In a PID
    namespace a signal N comes back as 128 + N, like a shell reports it; so does a
    program exiting with that number."""
    if mechanism != "process" and returncode is not None and 128 < returncode < 128 + 65:
        return -(returncode - 128)
    return returncode


async def _feed(proc: asyncio.subprocess.Process, data: bytes) -> None:
    """Write the program and close stdin; a run that died before reading it is fine."""
    assert proc.stdin is not None
    try:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(data)
            await proc.stdin.drain()
    finally:
        proc.stdin.close()


async def _reap(proc: asyncio.subprocess.Process) -> None:
    """Collect the killed run. asyncio's ``wait()`` also waits for the output pipe to
    close, so what a cut-off run still wrote is read and dropped first."""
    assert proc.stdout is not None and proc.stdin is not None
    proc.stdin.close()
    try:
        async with asyncio.timeout(_REAP_TIMEOUT_S):
            while await proc.stdout.read(65536):
                pass
            await proc.wait()
    except TimeoutError:  # only if something outside the process group holds the pipe
        logger.warning("sandbox: run %d did not end %ss after SIGKILL", proc.pid, _REAP_TIMEOUT_S)


async def _read_capped(proc: asyncio.subprocess.Process, output: bytearray, cap: int) -> bool:
    """Read until EOF into ``output``; True if it was cut at ``cap`` bytes."""
    assert proc.stdout is not None
    while chunk := await proc.stdout.read(65536):
        room = cap - len(output)
        output += chunk[: max(room, 0)]
        if len(chunk) > room:
            return True
    return False


def _kill_group(pgid: int) -> None:
    """Kill the run's process group: the mechanism's first process and what it started."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
