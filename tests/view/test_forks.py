"""A fork started from the page (``agentrl view --allow-fork``), through real vLLM.

Click "fork here" on turn 1 of a recorded episode: the viewer runs ``agentrl replay
--fork-at 1`` (the tiny model on vLLM's CPU build), shows its progress, and opens the
fork beside its parent with its first differing turn marked. The fork is the only
thing written to the run directory. It runs in ``make soak``. Without the flag, the
refusal is tested in test_page.py and test_server.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from agentrl.store import EpisodeStore
from tests.view.conftest import Viewer
from tests.view.resumed_runs import Resumed, build_resumed_run
from tests.view.test_server import base, get, post


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, tokenizer: Any) -> Resumed:
    return build_resumed_run(tmp_path_factory.mktemp("forkable"), tokenizer, str(tiny_model))


@pytest.fixture(scope="module")
def fork_viewer(resumed: Resumed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Viewer]:
    log = tmp_path_factory.mktemp("viewer") / "view.log"
    v = Viewer([str(resumed.run.parent), "--allow-fork"], log)
    try:
        yield v
    finally:
        v.stop()


def episode_ids(run: Path) -> set[str]:
    with EpisodeStore.open(run, create=False) as store:
        return {r["episode_id"] for r in store.episodes()}


@pytest.mark.timeout(180)
def test_bad_fork_requests_get_one_line_and_a_failed_fork_shows_why(
    fork_viewer: Viewer, resumed: Resumed
) -> None:
    """Everything that fails before an engine starts (no vLLM here)."""
    before = episode_ids(resumed.run)
    root, header = base(fork_viewer.url), {"X-Agentrl-Fork": "1"}
    assert get(root + "/api/features") == (200, {"fork": True})
    good = {"run": "resumed", "id": "t0/0", "turn": 9}
    status, text = post(root + "/api/fork", good, {})
    assert status == 403 and "X-Agentrl-Fork" in text  # the flag does not lift this
    for body, said in [
        ({**good, "id": "nope"}, "no episode 'nope' in run 'resumed'"),
        ({"run": "resumed", "id": "t0/0"}, "needs turn"),
        ({**good, "turn": "two"}, "turn='two' is not a whole number"),
        ({**good, "run": "elsewhere"}, "no run 'elsewhere'"),
    ]:
        status, text = post(root + "/api/fork", body, header)
        assert status == 400 and said in json.loads(text)["error"], (body, text)
    status, text = post(root + "/api/fork", good, header)
    assert status == 202, text
    job = json.loads(text)["job"]
    deadline = time.monotonic() + 150
    while (state := get(f"{root}/api/fork?job={job}")[1])["state"] == "running":
        assert time.monotonic() < deadline, state
        time.sleep(0.5)
    assert state["state"] == "failed" and state["fork_id"] is None
    assert "--fork-at 9" in state["lines"][0]  # the command it ran
    assert any("assistant turns 0..2" in line for line in state["lines"]), state["lines"]
    assert episode_ids(resumed.run) == before


@pytest.mark.vllm
@pytest.mark.soak  # about 3 minutes on 2 cores, most of it the engine's start
@pytest.mark.timeout(600)
def test_a_fork_started_from_the_page_appears_with_its_first_differing_turn(
    browser: Any, fork_viewer: Viewer, resumed: Resumed
) -> None:
    before = episode_ids(resumed.run)
    context = browser.new_context(bypass_csp=True)  # so wait_for_function may take a string
    try:
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.goto(f"{fork_viewer.url}#/episode?run=resumed&id={quote('t0/0', safe='')}")
        page.wait_for_selector(".fork-button")
        assert page.locator("#fork-hint").count() == 0
        assert page.locator(".fork-button").count() == 3  # one per assistant turn
        page.click(".fork-button[data-turn='1']")
        page.wait_for_selector("#fork-state")
        assert "--fork-at 1" in page.inner_text(".fork-log")  # the CLI's command, shown
        page.wait_for_function(
            "document.querySelector('h1')?.textContent.startsWith('t0/0~fork@1-')",
            timeout=540_000,
        )
        page.wait_for_selector("#first-diff")
        assert page.inner_text("#first-diff .first-diff-label") == "1"
        marked = page.locator(".msg.first-diff")
        assert marked.count() == 1 and marked.get_attribute("data-turn") == "1"
        assert "forked at turn 1 from t0/0" in page.inner_text("#lineage")
        fork_id = page.inner_text("h1")
    finally:
        context.close()
    assert episode_ids(resumed.run) - before == {fork_id}  # the fork, nothing else
    assert before <= episode_ids(resumed.run)
