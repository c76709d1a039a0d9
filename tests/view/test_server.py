"""The viewer's server: loopback by default, a token on any other host, one-line errors
for bad requests, and a run directory that is read, never written."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from agentrl.view import is_loopback, new_token
from tests.view.conftest import Viewer
from tests.view.runs import Built

pytestmark = pytest.mark.timeout(120)


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            body = r.read()
            return r.status, json.loads(
                body
            ) if r.headers.get_content_type() == "application/json" else body
    except urllib.error.HTTPError as e:
        body = e.read().decode()
        return e.code, json.loads(
            body
        ) if e.headers.get_content_type() == "application/json" else body


def base(url: str) -> str:
    parts = urlsplit(url)
    return f"http://127.0.0.1:{parts.port}"


def test_it_binds_loopback_by_default_and_needs_no_token_there(viewer: Viewer) -> None:
    assert viewer.url.startswith("http://127.0.0.1:") and "token" not in viewer.url
    status, body = get(base(viewer.url) + "/api/runs")
    assert status == 200 and [r["id"] for r in body["runs"]] == ["demo"]
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    assert new_token("127.0.0.1") is None and len(new_token("0.0.0.0") or "") >= 24


def test_another_host_refuses_every_request_without_its_token(
    built: Built, browser: Any, tmp_path: Path
) -> None:
    v = Viewer([str(built.root), "--host", "0.0.0.0"], tmp_path / "view.log")
    try:
        token = urlsplit(v.url).query.removeprefix("token=")
        assert len(token) >= 24
        root = base(v.url)
        for path in ("/", "/static/app.js", "/api/runs", "/api/run?run=demo"):
            assert get(root + path)[0] == 403, path
            assert get(root + path + ("&" if "?" in path else "?") + "token=wrong")[0] == 403
        status, body = get(f"{root}/api/runs?token={token}")
        assert status == 200 and body["runs"][0]["id"] == "demo"
        context = browser.new_context()
        page = context.new_page()
        page.goto(f"{root}/?token={token}")  # then the page's own requests carry a cookie
        page.click("tr[data-run='demo'] a")
        page.wait_for_selector("tr.episode-row", timeout=30_000)
        context.close()
    finally:
        v.stop()


def test_bad_requests_get_one_line_that_says_what_was_wrong(viewer: Viewer) -> None:
    root = base(viewer.url)
    status, body = get(f"{root}/api/episodes?run=demo&min_reward=high")
    assert status == 400 and body["error"] == "min_reward='high' is not a number"
    status, body = get(f"{root}/api/run?run=../../etc")
    assert status == 400 and "no run '../../etc'" in body["error"] and "['demo']" in body["error"]
    status, body = get(f"{root}/api/episode?run=demo&id=nope")
    assert status == 400 and body["error"].startswith("no episode 'nope'")
    status, body = get(f"{root}/api/episode?run=demo&id=t1/0&attempt=7")
    assert status == 400 and "has no attempt 7" in body["error"]
    status, body = get(f"{root}/api/episode?run=demo")
    assert status == 400 and "?id=" in body


def _content(run: Path) -> tuple[str, list[str]]:
    """A hash of every row of every table, and the files other than SQLite's WAL/SHM."""
    db = sqlite3.connect(f"file:{run / 'episodes.db'}?mode=ro", uri=True)
    digest = hashlib.sha256()
    for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name"):
        for row in db.execute(f"SELECT * FROM {table} ORDER BY rowid"):
            digest.update(repr(row).encode())
    db.close()
    files = sorted(p.name for p in run.iterdir() if not p.name.endswith(("-wal", "-shm")))
    return digest.hexdigest(), files


def test_serving_every_endpoint_leaves_the_run_directory_as_it_was(
    viewer: Viewer, built: Built
) -> None:
    before = _content(built.run)
    root = base(viewer.url)
    for path in (
        "/api/runs",
        "/api/run?run=demo",
        "/api/live?run=demo",
        "/api/episodes?run=demo&state=finished",
        "/api/episode?run=demo&id=t5/0",
        f"/api/episode?run=demo&id={built.paused}",
    ):
        assert get(root + path)[0] == 200, path
    assert _content(built.run) == before


def post(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, str]:
    request = urllib.request.Request(
        url,
        json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_without_allow_fork_a_fork_request_is_refused_with_one_line(
    viewer: Viewer, built: Built
) -> None:
    before = _content(built.run)
    root = base(viewer.url)
    assert get(root + "/api/features") == (200, {"fork": False})
    fork = {"run": "demo", "id": "t0/0", "turn": 1}
    status, text = post(root + "/api/fork", fork, {"X-Agentrl-Fork": "1"})
    assert status == 403 and "--allow-fork" in text and "--fork-at" in text
    assert "\n" not in text.strip()
    status, text = post(root + "/api/fork", fork, {})  # what a cross-site form could send
    assert status == 403 and "X-Agentrl-Fork" in text
    assert get(root + "/api/fork?job=1")[0] == 403
    assert get(root + "/api/fork?run=demo&id=t0/0&turn=1")[0] == 403  # a GET starts nothing
    assert _content(built.run) == before
