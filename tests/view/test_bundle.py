"""``agentrl view --bundle OUT/``: a static site that opens from disk (``file://``) in a
real headless Chromium, with the same run page, filters and episodes as the server."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.view.conftest import ROOT
from tests.view.runs import XSS, Built

pytestmark = pytest.mark.timeout(180)


def view(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "view", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def bundle(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "site"
    done = view(str(built.root), "--bundle", str(out))
    assert done.returncode == 0, done.stderr
    assert "wrote 15 episodes" in done.stdout
    return out


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.errors = []  # type: ignore[attr-defined]
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    yield page
    context.close()


def test_the_bundle_opens_from_disk_with_runs_filters_and_episodes(
    page: Any, bundle: Path, built: Built
) -> None:
    page.goto((bundle / "index.html").as_uri())
    page.click("tr[data-run='demo'] a")
    page.wait_for_selector("svg[data-metric='train/reward_mean']")
    assert page.inner_text("#page-info") == "1–15 of 15"
    page.select_option("select[name=state]", "retried")
    page.click("#apply")
    page.wait_for_selector("#page-info:text('1–1 of 1')")
    assert page.get_attribute("tr.episode-row", "data-episode") == built.resumed
    page.goto((bundle / "index.html").as_uri() + f"#/episode?run=demo&id={quote('t1/0', safe='')}")
    page.wait_for_selector("#tokens .tok")
    shown = page.eval_on_selector_all(".tok", "e => e.map(t => Number(t.dataset.v))")
    assert shown == built.versions["t1/0"]
    page.goto(
        (bundle / "index.html").as_uri() + f"#/episode?run=demo&id={quote(built.xss, safe='')}"
    )
    page.wait_for_selector("#tokens .tok")
    assert XSS in page.inner_text("#transcript")
    page.goto(
        (bundle / "index.html").as_uri() + f"#/episode?run=demo&id={quote(built.fork, safe='')}"
    )
    page.wait_for_selector("#first-diff")
    assert page.inner_text("#first-diff .first-diff-label") == "1"
    assert page.errors == []


def test_a_bundle_is_never_written_into_a_run_directory(built: Built) -> None:
    done = view(str(built.run), "--bundle", str(built.run / "site"))
    assert done.returncode == 1
    assert "inside the run directory" in done.stderr and "choose a folder outside" in done.stderr
    assert not (built.run / "site").exists()


def test_a_bundle_of_the_failed_attempts_only(built: Built, browser: Any, tmp_path: Path) -> None:
    out = tmp_path / "failed"
    done = view(str(built.root), "--bundle", str(out), "--where", "state=retried")
    assert done.returncode == 0, done.stderr
    assert "wrote 1 episodes" in done.stdout
    page = browser.new_context().new_page()
    page.goto((out / "index.html").as_uri() + "#/run?run=demo")
    assert page.wait_for_selector("tr.episode-row").get_attribute("data-episode") == built.resumed
    assert page.inner_text("#page-info") == "1–1 of 1"
    bad = view(str(built.root), "--bundle", str(tmp_path / "x"), "--where", "colour=red")
    assert bad.returncode == 1 and "--where colour=...: not a filter" in bad.stderr
    bad = view(str(built.root), "--bundle", str(tmp_path / "y"), "--where", "failed")
    assert bad.returncode == 1 and "write KEY=VALUE" in bad.stderr
