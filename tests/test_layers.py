"""The layers of docs/architecture.md hold (import-linter's contracts in pyproject.toml), the
check can fail, and the rollout engine implements the seams the trainer sees through."""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentrl.protocols import RolloutSource, WeightSync
from agentrl.rollout.controller import RolloutController
from agentrl.rollout.scheduler import Scheduler

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(project: Path) -> subprocess.CompletedProcess[str]:
    """Run lint-imports on ``project`` (its pyproject.toml and its ``agentrl``)."""
    # lint-imports puts its working folder first on sys.path, so the package found is
    # project/agentrl, not the installed one; COLUMNS keeps the report's lines whole.
    env = {**os.environ, "PYTHONPATH": str(project), "COLUMNS": "200"}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(project / "pyproject.toml")],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.timeout(60)
def test_every_import_contract_is_kept() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, f"import contracts broken:\n{result.stdout}{result.stderr}"
    assert "0 broken" in result.stdout, result.stdout


# (file in the copy of agentrl, line appended to it, contract broken, words in the report)
BREAKS = {
    "trainer imports rollout": (
        "trainer/loop.py",
        "from agentrl.rollout.scheduler import Scheduler",
        "agentrl layers",
        "agentrl.trainer.loop -> agentrl.rollout.scheduler",
    ),
    "inference imports rollout": (
        "inference/pool.py",
        "import agentrl.rollout.runner",
        "agentrl layers",
        "agentrl.inference.pool -> agentrl.rollout.runner",
    ),
    "ground imports up": (
        "types/values.py",
        "import agentrl.store",
        "agentrl layers",
        "agentrl.types.values -> agentrl.store",
    ),
    "module without a layer": (
        "unplaced.py",
        "x = 1",
        "agentrl layers",
        "agentrl.unplaced",
    ),
    "library imports envs": (
        "env/__init__.py",
        "import envs",
        "agentrl never imports",
        "agentrl.env -> envs",
    ),
    "sibling cycle": (
        "trainer/losses.py",
        "import agentrl.trainer.batch",
        "no import cycles",
        "No cycles are allowed in agentrl.trainer",
    ),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(BREAKS))
def test_a_broken_contract_fails_the_check(case: str, tmp_path: Path) -> None:
    """The project's own contracts, on a copy of agentrl with one forbidden import added."""
    file, line, contract, evidence = BREAKS[case]
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    package = tmp_path / "agentrl"
    shutil.copytree(ROOT / "agentrl", package, ignore=shutil.ignore_patterns("__pycache__"))
    target = package / file
    before = target.read_text() if target.exists() else ""
    target.write_text(f"{before}\n{line}  # added by tests/test_layers.py\n")

    result = lint_imports(tmp_path)
    report = result.stdout + result.stderr
    assert result.returncode != 0, f"lint-imports passed with `{line}` in {file}:\n{report}"
    broken = [s for s in report.splitlines() if s.startswith(contract) and " BROKEN" in s]
    assert broken, f"expected the contract {contract!r} broken:\n{report}"
    assert evidence in report, f"expected {evidence!r} in the report:\n{report}"


def _methods(protocol: type) -> list[str]:
    return [n for n, v in vars(protocol).items() if inspect.isfunction(v) and n[0] != "_"]


def _shape(function: Any) -> list[tuple[str, Any, Any]]:
    params = inspect.signature(function).parameters.values()
    return [(p.name, p.kind, p.default) for p in params]


@pytest.mark.parametrize(
    ("protocol", "implementation"), [(WeightSync, RolloutController), (RolloutSource, Scheduler)]
)
def test_the_rollout_engine_implements_the_trainers_seams(
    protocol: type, implementation: type
) -> None:
    """Structural, as the trainer relies on it: the same methods, parameters and async-ness."""
    assert _methods(protocol), f"{protocol.__name__} declares no methods"
    for name in _methods(protocol):
        want, have = getattr(protocol, name), getattr(implementation, name, None)
        where = f"{implementation.__name__}.{name} vs {protocol.__name__}.{name}"
        assert have is not None, f"{implementation.__name__} has no {name}"
        assert inspect.iscoroutinefunction(have) == inspect.iscoroutinefunction(want), where
        assert _shape(have) == _shape(want), where
