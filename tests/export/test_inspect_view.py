"""``inspect view`` (Inspect's own viewer) on an exported run, in a real headless browser.

Debian's chromium driven by Playwright: the export's folder of logs (three, at four
episodes a log) is listed whole, none hidden as a retry of another, and opening a log and
an episode shows its tool call, the tool's result and the final answer.
The screenshot is kept under the test's folder (and copied to ``$AGENTRL_DOCS_IMG`` when
that is set, which is how ``docs/img/inspect-view-export.png`` was made).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.export import export_run, inspect_format
from agentrl.store import EpisodeStore

CHROMIUM = Path("/usr/bin/chromium")
INSPECT = Path(sys.executable).with_name("inspect")

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium"),
    pytest.mark.skipif(not INSPECT.exists(), reason="needs inspect-ai (agentrl[export])"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(port: int, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"inspect view exited: {proc.communicate()[0]!r}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"inspect view did not listen on {port} in {timeout_s} s")


def test_inspect_view_shows_an_exported_episode(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    monkeypatch.setattr(inspect_format, "SAMPLES_PER_LOG", 4)  # 9 episodes: three logs
    with EpisodeStore.open(run_dir, create=False) as store:
        asyncio.run(export_run(store, "inspect", tmp_path / "logs"))
    port = _free_port()
    proc = subprocess.Popen(
        [
            str(INSPECT),
            "view",
            "--log-dir",
            str(tmp_path / "logs"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_for(port, proc)
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM))
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"http://127.0.0.1:{port}/", timeout=60_000)
            page.get_by_text("3 items").first.wait_for(timeout=60_000)  # the tasks: 3 logs
            assert page.get_by_text("agentrl/calc-demo").count() == 3, page.inner_text("body")
            page.goto(f"http://127.0.0.1:{port}/#/logs", timeout=60_000)  # by file name
            names = [f"calc-demo-000{k}.eval" for k in (1, 2, 3)]
            page.get_by_text(names[0]).first.wait_for(timeout=60_000)
            assert all(page.get_by_text(name).count() == 1 for name in names)  # none hidden
            page.get_by_text(names[0]).first.click()
            page.get_by_text("agentrl.Calculator-v0#0/1#0").first.click()
            page.get_by_text("Answer:").first.wait_for(timeout=60_000)
            body = page.inner_text("body")
            assert "calculator" in body and "What is" in body, body[:2000]
            shot = tmp_path / "inspect-view-export.png"
            page.screenshot(path=str(shot))
            browser.close()
        if os.environ.get("AGENTRL_DOCS_IMG"):
            shutil.copy(shot, Path(os.environ["AGENTRL_DOCS_IMG"]) / shot.name)
    finally:
        proc.terminate()
        proc.wait(10)
