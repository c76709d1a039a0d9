"""The fault table: every fault test records what it injected and what it found.

``record_fault(fault, injected=..., survived=..., lost=..., trained_twice=...)`` adds a
row (the measured values, recorded before the test asserts on them, so a failing test
shows what it saw). At the end of the session the table is printed; with
``AGENTRL_FAULT_TABLE=FILE`` it is also written there as Markdown (``make soak``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

_ROWS: list[dict[str, Any]] = []


@pytest.fixture
def record_fault(request: pytest.FixtureRequest) -> Callable[..., None]:
    def record(fault: str, *, injected: int, survived: int, lost: int,
               trained_twice: int = 0, runs: int | None = None) -> None:  # fmt: skip
        _ROWS.append({"fault": fault, "injected": injected, "runs": runs or injected,
                      "survived": survived, "lost": lost, "trained_twice": trained_twice,
                      "test": request.node.nodeid.split("::")[-1]})  # fmt: skip

    return record


def fault_table() -> str:
    lines = [
        "| Fault | Injected | Runs survived | Trajectories lost | Tasks trained twice | Test |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in _ROWS:
        lines.append(f"| {r['fault']} | {r['injected']} | {r['survived']}/{r['runs']} | "
                     f"{r['lost']} | {r['trained_twice']} | `{r['test']}` |")  # fmt: skip
    total = {k: sum(r[k] for r in _ROWS) for k in ("injected", "runs", "survived", "lost",
                                                    "trained_twice")}  # fmt: skip
    lines.append(f"| **all** | {total['injected']} | {total['survived']}/{total['runs']} | "
                 f"{total['lost']} | {total['trained_twice']} | |")  # fmt: skip
    return "\n".join(lines)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _ROWS:
        return
    table = fault_table()
    terminalreporter.section("fault injection")
    terminalreporter.write_line(table)
    target = os.environ.get("AGENTRL_FAULT_TABLE")
    if target:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(table + "\n")
