"""Where an episode resumed within one attempt: the marks, from the store to the page.

The episodes are the real runner's (:mod:`tests.view.resumed_runs`): one resumed from a
checkpoint under newer weights (as after a crash), one whose weights were published in
the middle of a turn. The page must put each mark right before the first token of the
resumed part, with the turn and the versions before and after.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from agentrl.store import EpisodeStore
from agentrl.view.resumes import resume_marks
from tests.view.conftest import Viewer
from tests.view.resumed_runs import Resumed, build_resumed_run

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, tokenizer: Any) -> Resumed:
    return build_resumed_run(tmp_path_factory.mktemp("resumed"), tokenizer, str(tiny_model))


@pytest.fixture(scope="module")
def resumed_viewer(resumed: Resumed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Viewer]:
    v = Viewer([str(resumed.run.parent)], tmp_path_factory.mktemp("viewer") / "view.log")
    try:
        yield v
    finally:
        v.stop()


def marks_of(run: Path, episode: str) -> list[dict[str, Any]]:
    with EpisodeStore.open(run, create=False) as store:
        (t,) = store.trajectories(episode)
    return resume_marks(_segments([t]), t.info, unfinished=False)


def _segments(trajectories: list[Any]) -> list[Any]:
    from agentrl.types import SegmentArrays

    return [
        SegmentArrays(t.token_ids, t.logprobs, t.versions, t.loss_mask, list(t.spans))
        for t in trajectories
    ]


def test_the_runner_records_a_checkpoint_resume_and_the_marks_place_it(resumed: Resumed) -> None:
    (mark,) = marks_of(resumed.run, "t0/1")
    assert mark == {
        "segment": 0,
        "token": resumed.checkpoint_token,
        "turn": 2,
        "before": 0,
        "after": 1,
        "why": "checkpoint",
    }
    (mark,) = marks_of(resumed.run, "t0/2")
    assert mark == {
        "segment": 0,
        "token": resumed.publish_token,
        "turn": 1,
        "before": 0,
        "after": 1,
        "why": "weight publish",
    }
    assert marks_of(resumed.run, "t0/0") == []  # played through under one version


MARK = (
    "(why) => { const m = document.querySelector(`.resume-mark[data-why='${why}']`);"
    " const toks = [...document.querySelectorAll('#tokens .tok')];"
    " const next = m.nextElementSibling, prev = m.previousElementSibling;"
    " return {token: Number(m.dataset.token), turn: Number(m.dataset.turn),"
    " next: toks.indexOf(next), nextV: Number(next.dataset.v),"
    " prevSampledV: Number(toks.slice(0, toks.indexOf(next)).filter(t => t.dataset.v >= 0)"
    ".pop().dataset.v), label: m.textContent,"
    " count: document.querySelectorAll('.resume-mark').length}; }"
)


@pytest.mark.parametrize("episode", ["t0/1", "t0/2"])
def test_the_page_marks_the_token_where_the_episode_resumed(
    browser: Any, resumed_viewer: Viewer, resumed: Resumed, episode: str
) -> None:
    why, token, turn = (
        ("checkpoint", resumed.checkpoint_token, resumed.checkpoint_turn)
        if episode == "t0/1"
        else ("weight publish", resumed.publish_token, resumed.publish_turn)
    )
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{resumed_viewer.url}#/episode?run=resumed&id={quote(episode, safe='')}")
        page.wait_for_selector(".resume-mark")
        shown = page.evaluate(MARK, why)
        assert shown["count"] == 1
        assert shown["token"] == shown["next"] == token  # right before that token
        assert shown["turn"] == turn
        assert (shown["prevSampledV"], shown["nextV"]) == (0, 1)  # the versions around it
        assert f"turn {turn}" in shown["label"] and "version 0 → 1" in shown["label"]
        assert f"token {token}" in page.inner_text("#resumes")
    finally:
        context.close()


def test_an_unfinished_episode_is_marked_where_its_checkpoint_ends_and_a_new_turn_version_too(
    built: Any,
) -> None:
    """The demo run of tests/view/runs.py, through ViewData (what the endpoint answers)."""
    from agentrl.view import ViewData

    data = ViewData(built.root)
    paused = data.episode("demo", built.paused, None)
    assert paused["unfinished"]
    assert paused["resumes"] == [
        {"segment": 0, "token": 3, "turn": 0, "before": 2, "after": None, "why": "checkpointed"}
    ]
    t1 = data.episode("demo", "t1/0", None)  # turn 0 sampled at version 1, turn 1 at 2
    versions = built.versions["t1/0"]
    first_v2 = versions.index(2)
    assert t1["resumes"] == [
        {"segment": 0, "token": first_v2, "turn": 1, "before": 1, "after": 2, "why": "turn start"}
    ]
