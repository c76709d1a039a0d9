"""tests/ mirrors agentrl/: where the test of a piece lives has one rule.

A test of ``agentrl/x/y.py`` lives in ``tests/x/test_y.py`` (or another file of
``tests/x/`` when it tests the package as a whole); a test of the module
``agentrl/x.py`` in ``tests/test_x.py`` (or a folder ``tests/x/`` when it has several
files). Suites that cross every package have their own folders, and checks of the whole
project their own top-level files: both listed here.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
PACKAGE = ROOT / "agentrl"
SUITES = {"benchmarks", "docs", "examples", "faults"}
"""Folders that test across the package: the benchmark scripts, the docs site, the shipped
examples, whole runs under injected faults."""
PROJECT_CHECKS = {"formatting", "layers", "layout", "package", "rooms", "shipped_envs"}
"""Top-level files that check the project as a whole (envs/ and tools/ included)."""


def _is_module(name: str) -> bool:
    return (PACKAGE / f"{name}.py").is_file()


def _is_package(name: str) -> bool:
    return (PACKAGE / name / "__init__.py").is_file()


def test_every_test_folder_is_a_package_a_module_or_a_suite() -> None:
    stray = [
        folder.name
        for folder in sorted(TESTS.iterdir())
        if folder.is_dir()
        and (folder / "__init__.py").exists()
        and folder.name not in SUITES
        and not _is_package(folder.name)
        and not _is_module(folder.name)
    ]
    assert not stray, f"tests/{stray[0]}/ mirrors nothing in agentrl/ (move its tests)"


def test_every_top_level_test_file_tests_a_module_of_that_name() -> None:
    for path in sorted(TESTS.glob("test_*.py")):
        name = path.stem.removeprefix("test_")
        if name in PROJECT_CHECKS:
            continue
        assert not _is_package(name), (
            f"{path.name}: agentrl/{name}/ is a package, move it to tests/{name}/"
        )
        assert _is_module(name), f"{path.name}: there is no agentrl/{name}.py to mirror"
