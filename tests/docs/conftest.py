"""The docs site, built once per session into a temporary folder (``mkdocs build --strict``)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class BuiltSite:
    """Where the site was built, and what ``mkdocs build`` printed."""

    path: Path
    returncode: int
    output: str

    def page(self, rel: str) -> str:
        """The HTML of a page by its source path (``reference/cli.md``)."""
        html = self.path / Path(rel).with_suffix("") / "index.html"
        if rel == "index.md":
            html = self.path / "index.html"
        return html.read_text()


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> BuiltSite:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--quiet",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DISABLE_MKDOCS_2_WARNING": "true", "NO_MKDOCS_2_WARNING": "1"},
    )
    return BuiltSite(out, proc.returncode, proc.stdout + proc.stderr)
