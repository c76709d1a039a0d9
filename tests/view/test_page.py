"""The viewer's page in a real headless Chromium against ``agentrl view`` (a subprocess)
over a run directory written with the store's API.

Open the run (status, charts, config); filter and page the episodes; open an episode
and check the token colours against the versions stored for it, for every token; switch
overlays; a crash-resumed episode shows its two attempts; a fork shows its first
differing turn; ``<script>alert(1)</script>`` from the model is shown as text and never
runs; in-flight episodes of a running train appear and go without a reload.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

from tests.view.conftest import Viewer
from tests.view.runs import XSS, Built

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def page(browser: Any, viewer: Viewer) -> Iterator[Any]:
    # CSP bypassed so that wait_for_function may evaluate strings; the XSS test then
    # shows the page escapes text by itself, without its Content-Security-Policy.
    context = browser.new_context(bypass_csp=True)
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.dialogs = []  # type: ignore[attr-defined]
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    page.errors = []  # type: ignore[attr-defined]
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    try:
        yield page
    finally:
        context.close()


COLOURS = "e => e.map(t => getComputedStyle(t).backgroundColor)"
ROW_KEYS = "e => e.map(r => r.dataset.episode + '#' + r.dataset.attempt)"


def episode_url(viewer: Viewer, episode: str, attempt: int | None = None) -> str:
    tail = "" if attempt is None else f"&attempt={attempt}"
    return f"{viewer.url}#/episode?run=demo&id={quote(episode, safe='')}{tail}"


def test_the_runs_list_and_a_run_page(page: Any, viewer: Viewer) -> None:
    page.goto(viewer.url)
    row = page.locator("tr[data-run='demo']")
    assert row.locator("td").nth(1).inner_text() == "train"
    assert row.locator("td").nth(2).inner_text() == "ended"
    assert row.locator("td").nth(3).inner_text() == "3 / 5"
    row.locator("a").click()
    page.wait_for_selector("svg.chart")
    metrics = page.eval_on_selector_all("svg.chart", "e => e.map(s => s.dataset.metric)")
    assert {"train/reward_mean", "train/success_rate", "train/tokens_per_s"} <= set(metrics)
    points = page.get_attribute("svg[data-metric='train/reward_mean'] polyline", "points")
    assert len(points.split()) == 5  # one point per metrics.jsonl row
    assert "steps = 5" in page.inner_text("#config")
    assert page.errors == []


def test_filtering_and_paging_the_episodes(page: Any, viewer: Viewer) -> None:
    page.goto(f"{viewer.url}#/run?run=demo")
    page.wait_for_selector("tr.episode-row")
    assert page.inner_text("#page-info") == "1–15 of 15"
    page.select_option("select[name=state]", "retried")
    page.click("#apply")
    page.wait_for_function("document.querySelector('#page-info').textContent === '1–1 of 1'")
    rows = page.locator("tr.episode-row")
    assert rows.get_attribute("data-episode") == "t5/0"
    assert rows.get_attribute("data-attempt") == "0"
    assert "env_timeout" in rows.inner_text()
    page.select_option("select[name=state]", "")
    page.fill("input[name=min_version_span]", "1")
    page.fill("input[name=min_reward]", "0.5")
    page.click("#apply")
    page.wait_for_function("document.querySelector('#page-info').textContent.endsWith('of 10')")
    spans = page.eval_on_selector_all(
        "tr.episode-row td:nth-child(9)", "e => e.map(x => x.textContent)"
    )
    assert all(int(b) - int(a) >= 1 for a, b in (s.split("..") for s in spans)), spans
    page.goto(f"{viewer.url}#/run?run=demo&limit=4")
    page.wait_for_function("document.querySelector('#page-info')?.textContent === '1–4 of 15'")
    seen = []
    for shown in ("5–8 of 15", "9–12 of 15", "13–15 of 15"):
        seen += page.eval_on_selector_all("tr.episode-row", ROW_KEYS)
        page.click("#next")
        page.wait_for_function(f"document.querySelector('#page-info').textContent === '{shown}'")
    seen += page.eval_on_selector_all("tr.episode-row", ROW_KEYS)
    assert len(seen) == len(set(seen)) == 15  # every attempt once, over four pages
    assert page.is_disabled("#next")


def test_token_colours_match_the_stored_versions_in_every_overlay(
    page: Any, viewer: Viewer, built: Built
) -> None:
    page.goto(episode_url(viewer, "t1/0"))
    page.wait_for_selector("#tokens .tok")
    stored = built.versions["t1/0"]
    shown = page.eval_on_selector_all(".tok", "e => e.map(t => Number(t.dataset.v))")
    assert shown == stored
    colours = page.eval_on_selector_all(
        ".tok", "e => e.map(t => getComputedStyle(t).backgroundColor)"
    )
    swatches = (
        "e => e.map(i => [Number(i.dataset.v), "
        "getComputedStyle(i.querySelector('.swatch')).backgroundColor])"
    )
    legend = dict(page.eval_on_selector_all(".legend-item", swatches))
    assert sorted(legend) == sorted({v for v in stored if v >= 0}) == [1, 2]
    assert legend[1] != legend[2]
    for v, colour in zip(stored, colours, strict=True):
        assert colour == (legend[v] if v >= 0 else "rgba(0, 0, 0, 0)"), (v, colour)
    page.select_option("#overlay", "logprob")
    by_logprob = page.eval_on_selector_all(
        ".tok", "e => e.map(t => getComputedStyle(t).backgroundColor)"
    )
    assert by_logprob != colours
    assert [c != "rgba(0, 0, 0, 0)" for c in by_logprob] == [v >= 0 for v in stored]
    page.select_option("#overlay", "none")
    plain = page.eval_on_selector_all(
        ".tok", "e => e.map(t => getComputedStyle(t).backgroundColor)"
    )
    assert set(plain) == {"rgba(0, 0, 0, 0)"}
    text = page.inner_text("#tokens")
    assert "The answer is 3." in text  # the tokens decoded by the run's own tokenizer
    assert "calculator" in page.inner_text("#transcript")  # the tool call and its result
    page.select_option("#overlay", "advantage")  # the trainer's record of this episode
    by_advantage = page.eval_on_selector_all(".tok", COLOURS)
    assert [c != "rgba(0, 0, 0, 0)" for c in by_advantage] == [v >= 0 for v in stored]
    page.select_option("#overlay", "masked")
    masked = [c != "rgba(0, 0, 0, 0)" for c in page.eval_on_selector_all(".tok", COLOURS)]
    last_sampled = max(i for i, v in enumerate(stored) if v >= 0)
    assert masked == [i == last_sampled for i in range(len(stored))]
    page.click("#env-log summary")
    states = page.eval_on_selector_all(".state-diff", "e => e.map(d => d.textContent)")
    assert states == [
        'state: {"target":3,"guesses":0}',
        "state: guesses: 0 → 1",
        "state: guesses: 1 → 2",
    ]


def test_a_resumed_episode_shows_its_two_attempts(page: Any, viewer: Viewer) -> None:
    page.goto(episode_url(viewer, "t5/0"))
    attempts = page.locator("#attempts a.attempt")
    attempts.first.wait_for()
    assert attempts.count() == 2
    assert "#0 retried" in attempts.nth(0).inner_text()
    assert "#1 finished" in attempts.nth(1).inner_text()
    assert page.inner_text("#episode-state") == "finished"
    attempts.nth(0).click()
    page.wait_for_function("document.querySelector('#episode-state')?.textContent === 'retried'")
    assert "env_timeout" in page.inner_text("main")


def test_a_fork_shows_its_first_differing_turn(page: Any, viewer: Viewer, built: Built) -> None:
    page.goto(episode_url(viewer, built.fork))
    page.wait_for_selector("#first-diff")
    assert page.inner_text("#first-diff .first-diff-label") == "1"
    marked = page.locator(".msg.first-diff")
    assert marked.count() == 1 and marked.get_attribute("data-turn") == "1"
    assert "Perhaps it is 7." in marked.inner_text()
    page.click(f"#lineage a:text('{built.fork_parent}')")
    page.wait_for_function(f"document.querySelector('h1')?.textContent === '{built.fork_parent}'")
    assert built.fork in page.inner_text("#lineage")


def test_model_text_that_is_html_is_shown_as_text(page: Any, viewer: Viewer, built: Built) -> None:
    page.goto(episode_url(viewer, built.xss))
    page.wait_for_selector("#tokens .tok")
    assert XSS in page.inner_text("#transcript")
    assert XSS in page.inner_text("#tokens").replace("\n", "")
    assert page.locator("main script").count() == 0
    page.wait_for_timeout(300)
    assert page.dialogs == []


def test_in_flight_episodes_update_without_a_reload(
    page: Any, viewer: Viewer, built: Built
) -> None:
    """status.json as a running train writes it (this process stands in for its pid)."""
    status = built.run / "status.json"
    finished = status.read_text()

    def running(episodes: list[str]) -> None:
        live = [
            {
                "episode": e,
                "env": "agentrl/Calculator-v0",
                "turn": 1,
                "phase": "engine",
                "started_version": 1,
                "tokens_by_version": {"1": 5, "2": 7},
                "tool_calls": 0,
                "age_s": 3.0,
            }
            for e in episodes
        ]
        tmp = status.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "state": "training",
                    "pid": os.getpid(),
                    "step": 3,
                    "steps": 5,
                    "version": 3,
                    "updated_at": time.time(),
                    "episodes": live,
                    "in_flight": len(live),
                }
            )
        )
        os.replace(tmp, status)

    try:
        running(["t9/0", "t9/1"])
        page.goto(f"{viewer.url}#/run?run=demo")
        page.wait_for_selector("tr.live-episode[data-episode='t9/1']")
        assert page.inner_text("#run-status") == "running"
        row = page.locator("tr.live-episode[data-episode='t9/0'] td")
        assert [row.nth(i).inner_text() for i in (2, 3, 4, 5)] == ["1", "engine", "12", "2"]
        page.evaluate("window.marker = 1")  # gone if the page reloads
        running(["t9/1", "t10/0"])
        page.wait_for_selector("tr.live-episode[data-episode='t10/0']")
        page.wait_for_selector("tr.live-episode[data-episode='t9/0']", state="detached")
        assert page.evaluate("window.marker") == 1
    finally:
        status.write_text(finished)


def test_without_allow_fork_the_page_has_no_fork_control_and_names_the_cli(
    page: Any, viewer: Viewer, built: Built
) -> None:
    page.goto(episode_url(viewer, built.fork_parent))
    page.wait_for_selector("#fork-hint")
    hint = page.inner_text("#fork-hint")
    assert f"agentrl replay {built.run} '{built.fork_parent}' --fork-at TURN" in hint
    assert "--allow-fork" in hint
    assert page.locator(".fork-button").count() == 0
    refused = page.evaluate(
        "async () => { const r = await fetch('api/fork', {method: 'POST', headers: "
        "{'Content-Type': 'application/json', 'X-Agentrl-Fork': '1'}, body: JSON.stringify("
        "{run: 'demo', id: 't0/0', turn: 1})}); return [r.status, await r.text()]; }"
    )
    assert refused[0] == 403 and "--allow-fork" in refused[1]
    assert page.errors == []
