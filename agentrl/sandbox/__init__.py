"""The sandbox for code a model writes: OS isolation, proven by an escape suite.

Every tool that runs model-written code goes through :func:`run_python`. A run gets,
where the machine allows it, its own user, mount, PID, network, IPC and UTS namespaces
(bubblewrap, else util-linux ``unshare``), uid 65534 without capabilities, a read-only
view of the system, and a size-limited tmpfs as its only writable place; in every
mechanism also rlimits, a seccomp filter (no programs, no new processes, no ptrace, no
signals to others, no sockets unless allowed), a stripped environment, a wall-clock
kill of everything it started, capped output, and a PEP 578 audit hook as an extra
layer. :class:`SandboxPolicy` says which isolation a tool needs: by default
(``auto``: ``$AGENTRL_SANDBOX`` when set, else ``os``) it refuses to run without OS
isolation; ``fallback`` or ``process`` allow the weaker plain-process mode explicitly.
:func:`resolve` says which one is in force here and :data:`DESCRIPTIONS` what it means;
:func:`mark_tool` marks a tool that runs model-written code, so that
``agentrl check-env`` can report its mode.

Modules: :mod:`.limits` (the values), :mod:`.isolation` (the command line per
mechanism), :mod:`.runner` (choosing, running, deadlines), :mod:`.inside` (the program
that seals the process inside), :mod:`.audit` (its audit hook). Standard library only.
"""

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
from agentrl.sandbox.runner import (
    DESCRIPTIONS,
    INSTALL_HINT,
    TOOL_ATTRIBUTE,
    WEAKER_HINT,
    mark_tool,
    probe,
    resolve,
    run_python,
    tool_policy,
)

__all__ = [
    "DESCRIPTIONS",
    "ENV_VAR",
    "INSTALL_HINT",
    "MECHANISMS",
    "OS_MECHANISMS",
    "TOOL_ATTRIBUTE",
    "WEAKER_HINT",
    "IsolationChoice",
    "Mechanism",
    "SandboxLimits",
    "SandboxPolicy",
    "SandboxResult",
    "SandboxUnavailableError",
    "mark_tool",
    "probe",
    "resolve",
    "run_python",
    "tool_policy",
]
