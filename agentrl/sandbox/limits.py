"""The values of one sandboxed run: its limits, its policy, its result, and the error
raised when the isolation a policy asks for is not available.

Owns :class:`SandboxLimits`, :class:`SandboxPolicy`, :class:`SandboxResult` and
:class:`SandboxUnavailableError`. Standard library only; does not start anything.
"""

from __future__ import annotations

import dataclasses
import signal
from typing import Literal, get_args

from agentrl.errors import InfraError

Mechanism = Literal["bwrap", "unshare", "process"]
"""How a run is isolated. ``bwrap`` (bubblewrap) and ``unshare`` (util-linux) put it in
its own user, mount, PID, network, IPC and UTS namespaces with a read-only view of the
system and a size-limited tmpfs as the only writable place: OS isolation. ``process``
is a plain child process (rlimits, seccomp, the audit hook): no OS isolation."""

IsolationChoice = Literal["auto", "os", "fallback", "bwrap", "unshare", "process"]
"""``os``: the best OS mechanism that works here, refusing to run without one;
``fallback``: the same, but running as a plain ``process`` (with a warning) where there
is none, the weaker mode allowed explicitly; or one mechanism. ``auto`` (the default):
``$AGENTRL_SANDBOX`` when set, else ``os``."""

MECHANISMS: tuple[Mechanism, ...] = get_args(Mechanism)
OS_MECHANISMS: tuple[Mechanism, ...] = ("bwrap", "unshare")
ENV_VAR = "AGENTRL_SANDBOX"
"""Overrides an ``auto`` policy, e.g. ``AGENTRL_SANDBOX=fallback`` (or ``process``) on a
machine without OS isolation that may run model-written code without it."""


class SandboxUnavailableError(InfraError):
    """The isolation the policy asks for cannot be set up on this machine."""


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Resource limits of one sandboxed run."""

    wall_s: float = 10.0
    """Wall-clock deadline; then everything the run started is killed."""
    cpu_s: int = 5
    """CPU seconds (RLIMIT_CPU: SIGXCPU, then SIGKILL a second later)."""
    memory_bytes: int = 512 * 2**20
    """Address space of the process (RLIMIT_AS): a bigger allocation is a MemoryError."""
    max_processes: int = 8
    """RLIMIT_NPROC (threads count). The seccomp filter refuses new processes anyway;
    root is exempt from this rlimit, the filter is not."""
    max_file_bytes: int = 16 * 2**20
    """Largest file the run may write (RLIMIT_FSIZE)."""
    max_open_files: int = 64
    """RLIMIT_NOFILE."""
    max_disk_bytes: int = 64 * 2**20
    """Size of the tmpfs that is the run's only writable place (OS isolation only)."""
    max_files: int = 4096
    """Inodes of that tmpfs: empty files cost no bytes, but kernel memory each."""
    max_output_bytes: int = 16_384
    """Captured output (stdout and stderr together) beyond this is cut."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value <= 0:
                raise ValueError(f"SandboxLimits.{field.name} must be > 0, got {value!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxPolicy:
    """What isolation a tool needs and what the run may reach."""

    isolation: IsolationChoice = "auto"
    """See :data:`IsolationChoice`; ``auto`` is ``$AGENTRL_SANDBOX`` when set, else ``os``
    (refuse to run without OS isolation)."""
    network: bool = False
    """Let the run reach the host's network (it then shares the host's network
    namespace). Off: its own empty network namespace, and no sockets at all."""
    audit_hook: bool = True
    """Install the PEP 578 audit hook as an extra layer. Never the boundary: the tests
    turn it off to prove the OS layer holds alone."""

    def __post_init__(self) -> None:
        if self.isolation not in get_args(IsolationChoice):
            raise ValueError(
                f"SandboxPolicy.isolation is {self.isolation!r}; "
                f"expected one of {list(get_args(IsolationChoice))}"
            )


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxResult:
    """Exit status and captured output of one run, and the mechanism that ran it."""

    returncode: int | None
    output: str
    timed_out: bool = False
    output_truncated: bool = False
    mechanism: Mechanism | None = None

    def as_text(self) -> str:
        """The output and a note on how the run ended, as the model sees it."""
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
