"""The house's room sizes: no module in agentrl/ over 500 lines, no function over 80.

A module that outgrew its room is split where it already divides (a wire, a process, a
pool, a setup); a function over 80 lines is split into named steps. The benchmarks count
too: they are read as often as the library.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULE_LINES = 500
FUNCTION_LINES = 80


def _sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = node.end_lineno - node.lineno + 1
            if lines > FUNCTION_LINES:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    return found


@pytest.mark.timeout(60)
def test_no_module_in_agentrl_is_over_500_lines() -> None:
    over = {
        str(p.relative_to(ROOT)): n
        for p in _sources("agentrl")
        if (n := len(p.read_text().splitlines())) > MODULE_LINES
    }
    assert not over, f"modules over {MODULE_LINES} lines (split where they divide): {over}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("folder", ["agentrl", "benchmarks"])
def test_no_function_is_over_80_lines(folder: str) -> None:
    files = _sources(folder)
    assert files, f"no Python files under {folder}/"
    over = [f for p in files for f in _long_functions(p)]
    assert not over, f"functions over {FUNCTION_LINES} lines (split into named steps): {over}"
