"""The formatting rule: ruff format at the project's line length, with no opt-outs.

`make lint` runs the same checks; this test keeps them in `make test` (which CI runs),
so code that the formatter would change, or that switches it off, does not land.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["agentrl", "envs", "tools", "tests", "benchmarks", "examples", "scripts", "docs/img"]
RUFF = Path(sys.executable).parent / "ruff"


def test_ruff_format_leaves_every_file_as_it_is() -> None:
    done = subprocess.run(
        [str(RUFF), "format", "--check", *PATHS], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, f"run `ruff format {' '.join(PATHS)}`:\n{done.stdout}"


def test_ruff_check_is_clean() -> None:
    done = subprocess.run([str(RUFF), "check", *PATHS], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]


def test_the_formatter_is_never_switched_off() -> None:
    markers = ("fmt: " + "skip", "fmt: " + "off")  # split so this file does not match itself
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in PATHS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if any(marker in line for marker in markers)
    ]
    assert not found, (
        f"formatter switched off at: {found[:10]} (remove the markers, then ruff format)"
    )
