"""Named fault points, for fault-injection tests of whole runs.

A fault point is a line in the code where a test may ask the process to die, at an
exact moment no outside timer could hit reliably: half-way through a store
transaction, between the backward pass and the optimizer step, with the engine
paused for a weight update, right after tokens were sampled. The points:

=================  ======================================================================
``store_write``    inside a store transaction, after its first write, before the commit
``optimizer_step`` after the backward pass, before ``optimizer.step()``
``weight_update``  the engine is paused for a weight update, the new weights not loaded
``generation``     a generation call has returned its tokens, not yet recorded anywhere
=================  ======================================================================

Set ``AGENTRL_FAULTS`` to a comma-separated list of ``POINT@N`` (die with SIGKILL the
N-th time POINT is reached; ``POINT`` alone means the first time), e.g.
``AGENTRL_FAULTS=optimizer_step@3``. ``POINT@N=TERM`` (or ``=HUP``, ``=INT``) sends
that signal to the process instead, as a job scheduler would, and carries on: the
process then stops the way it handles that signal. Unset (always, outside tests), a
fault point costs one dict lookup.
"""

from __future__ import annotations

import os
import signal
import sys

POINTS = ("store_write", "optimizer_step", "weight_update", "generation")

SIGNALS = {
    "KILL": signal.SIGKILL,
    "TERM": signal.SIGTERM,
    "HUP": signal.SIGHUP,
    "INT": signal.SIGINT,
}

_armed: dict[str, tuple[int, signal.Signals]] = {}
_hits: dict[str, int] = {}


def _parse(spec: str) -> dict[str, tuple[int, signal.Signals]]:
    armed = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        where, _, sig = item.partition("=")
        name, _, count = where.partition("@")
        if name not in POINTS:
            raise ValueError(
                f"AGENTRL_FAULTS names an unknown fault point {name!r}; known: {', '.join(POINTS)}"
            )
        if (sig or "KILL") not in SIGNALS:
            raise ValueError(
                f"AGENTRL_FAULTS item {item!r}: the signal after = must be one of "
                f"{', '.join(SIGNALS)}"
            )
        try:
            armed[name] = (int(count) if count else 1, SIGNALS[sig or "KILL"])
        except ValueError:
            raise ValueError(
                f"AGENTRL_FAULTS item {item!r}: the count after @ must be an integer"
            ) from None
    return armed


def arm(spec: str) -> None:
    """Arm the fault points in ``spec`` (the ``AGENTRL_FAULTS`` syntax); reset the counts."""
    _armed.clear()
    _hits.clear()
    _armed.update(_parse(spec))


def point(name: str) -> None:
    """Die here (SIGKILL, no cleanup), or get the armed signal, if a test armed this
    point for this hit."""
    if not _armed or name not in _armed:
        return
    _hits[name] = _hits.get(name, 0) + 1
    count, sig = _armed[name]
    if _hits[name] == count:
        sys.stderr.write(f"agentrl fault injection: {sig.name} at {name} (hit {_hits[name]})\n")
        sys.stderr.flush()
        os.kill(os.getpid(), sig)


if os.environ.get("AGENTRL_FAULTS"):
    arm(os.environ["AGENTRL_FAULTS"])

__all__ = ["POINTS", "arm", "point"]
