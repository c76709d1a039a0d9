"""The ``python`` tool: runs the model's code in agentrl's sandbox.

Each call runs the program in a fresh sandbox (:mod:`agentrl.sandbox`): where the
machine allows it, its own user, mount, PID, network, IPC and UTS namespaces
(bubblewrap, else ``unshare``), uid 65534 with no capabilities, a read-only view of
the system and a size-limited tmpfs as the only writable place; always rlimits, a
seccomp filter, a stripped environment, a wall-clock kill, capped output, and a PEP
578 audit hook as an extra layer. Every failure of the program comes back as text for
the model; only a missing isolation that the policy demands raises
(:class:`agentrl.sandbox.SandboxUnavailableError`).

``python`` is the tool with the default policy: the best OS isolation available, and
a refusal (a tool error naming what to install) where there is none, unless
``AGENTRL_SANDBOX=fallback`` (or ``process``) allows the weaker plain-process mode.
:func:`python_tool` makes one with its own policy or limits, e.g.
``python_tool(SandboxPolicy(isolation="fallback"))`` for an env that may run code
without OS isolation. Both are marked (:func:`agentrl.sandbox.mark_tool`), so
``agentrl check-env`` reports the mode they run in.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from agentrl.sandbox import SandboxLimits, SandboxPolicy, SandboxResult, mark_tool
from agentrl.sandbox import run_python as _run_sandboxed

__all__ = ["SandboxLimits", "SandboxPolicy", "SandboxResult", "python", "python_tool", "run_python"]


async def run_python(
    code: str, limits: SandboxLimits | None = None, policy: SandboxPolicy | None = None
) -> SandboxResult:
    """Run ``code`` in the sandbox and return its status and (capped) output."""
    return await _run_sandboxed(code, limits or SandboxLimits(), policy or SandboxPolicy())


def python_tool(
    policy: SandboxPolicy | None = None, limits: SandboxLimits | None = None
) -> Callable[[str], Awaitable[str]]:
    """The ``python`` tool with its own sandbox policy and limits (defaults when None)."""

    async def python(code: str) -> str:
        """Run Python code in a sandbox and return what it printed.

        Args:
            code: A complete Python program; use print() to show results.
        """
        result = await run_python(code, limits, policy)
        return result.as_text()

    python.__qualname__ = "python"  # the default one is then tools.python_sandbox.python
    return mark_tool(python, policy or SandboxPolicy())


python = python_tool()
