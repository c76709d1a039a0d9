"""The viewer's test fixtures: run directories written with the store's API, the
``agentrl view`` server as a subprocess, and one headless Chromium per test module.

The browser is the OS's chromium (``/usr/bin/chromium``, installed by ``make install``
where apt can) driven by Playwright; nothing downloads a browser. Without it these
tests fail (not skip): the page is only tested in a real browser.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.view.runs import Built, build_runs

CHROMIUM = os.environ.get("AGENTRL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Built:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    return build_runs(tmp_path_factory.mktemp("runs"), tokenizer, str(tiny_model))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"no chromium at {CHROMIUM}: `make install` installs it (apt-get install "
            "chromium), or set AGENTRL_CHROMIUM to a Chromium binary"
        )
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


class Viewer:
    """``agentrl view ARGS`` in a subprocess; :attr:`url` is the URL it printed."""

    def __init__(self, args: list[str], log: Path) -> None:
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agentrl.cli", "view", *args, "--no-browser"],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self.url = self._wait_for_url()

    def _wait_for_url(self, timeout_s: float = 60) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = re.search(r"agentrl view: (http://\S+)", self.log.read_text(errors="replace"))
            if found:
                return found.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"agentrl view printed no URL:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()


@pytest.fixture(scope="module")
def viewer(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Viewer]:
    v = Viewer([str(built.root)], tmp_path_factory.mktemp("viewer") / "view.log")
    try:
        yield v
    finally:
        v.stop()
