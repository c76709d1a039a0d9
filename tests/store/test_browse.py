"""Paged episode reads (agentrl.store.browse) on a real SQLite store: every filter
selects what ``EpisodeStore.episodes`` (``agentrl replay``'s list) selects, and the pages
together hold each matching attempt exactly once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentrl.store import EpisodeStore, browse
from tests.view.runs import Built, build_runs

pytestmark = pytest.mark.timeout(60)


class _Chars:
    """A tokenizer of one id per character (enough for token arrays)."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> Any:
        return type("Encoded", (), {"input_ids": [ord(c) for c in text]})()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_runs(tmp_path_factory.mktemp("runs"), _Chars(), "none")


def keys(rows: list[dict[str, Any]]) -> set[tuple[str, int]]:
    return {(r["episode_id"], r["attempt"]) for r in rows}


@pytest.mark.parametrize(
    ("where", "replay"),
    [
        (browse.EpisodeFilter(), {}),
        (browse.EpisodeFilter(state="retried"), {"state": "retried"}),
        (browse.EpisodeFilter(env_id="agentrl/Calculator-v0"), {"env_id": "agentrl/Calculator-v0"}),
        (
            browse.EpisodeFilter(min_reward=0.5, max_reward=1.0),
            {"min_reward": 0.5, "max_reward": 1.0},
        ),
        (browse.EpisodeFilter(min_version_span=1), {"min_version_span": 1}),
    ],
)
def test_each_filter_selects_what_replay_lists(built: Built, where: Any, replay: Any) -> None:
    with EpisodeStore.open(built.run, create=False) as store:
        rows, total = browse.episode_page(store, where, limit=1000)
        expected = store.episodes(**replay)
    assert keys(rows) == keys(expected) and total == len(expected) > 0


def test_failure_attempt_and_origin_filters(built: Built) -> None:
    with EpisodeStore.open(built.run, create=False) as store:
        failed, _ = browse.episode_page(store, browse.EpisodeFilter(failure="env_timeout"))
        second, _ = browse.episode_page(store, browse.EpisodeFilter(attempt=1))
        replays, _ = browse.episode_page(store, browse.EpisodeFilter(origin="replay"))
        facets = browse.facets(store)
    assert keys(failed) == {(built.resumed, 0)} and failed[0]["failure"] == "env_timeout"
    assert keys(second) == {(built.resumed, 1)}
    assert keys(replays) == {(built.fork, 0)}
    assert "env_timeout" in facets["failures"] and facets["attempts"] == [0, 1]
    assert facets["states"] == ["finished", "paused", "retried"]


def test_pages_hold_each_attempt_once_with_its_token_summary(built: Built) -> None:
    with EpisodeStore.open(built.run, create=False) as store:
        everything = {(r["episode_id"], r["attempt"]): r for r in store.episodes()}
        seen: list[tuple[str, int]] = []
        for offset in range(0, 20, 4):
            rows, total = browse.episode_page(store, browse.EpisodeFilter(), limit=4, offset=offset)
            seen += [(r["episode_id"], r["attempt"]) for r in rows]
            for r in rows:
                want = everything[(r["episode_id"], r["attempt"])]
                assert (r["tokens"], r["v_min"], r["v_max"]) == (
                    want["tokens"],
                    want["v_min"],
                    want["v_max"],
                )
                assert r["turns"] == (
                    None
                    if r["state"] == "paused"
                    else 1
                    if r["attempt"] == 0 and r["episode_id"] == built.resumed
                    else 2
                )
    assert len(seen) == len(set(seen)) == total == len(everything) == 15


def test_lineage_and_cohorts(built: Built) -> None:
    with EpisodeStore.open(built.run, create=False) as store:
        assert [a["state"] for a in browse.attempts(store, built.resumed)] == [
            "retried",
            "finished",
        ]
        assert browse.derived(store, built.fork_parent) == [built.fork]
        assert browse.derived(store, "t0_0") == []  # LIKE's wildcards are escaped
        steps = browse.cohorts(store)
    assert [c["step"] for c in steps] == [2, 1, 0]
    assert sorted(steps[-1]["episodes"]) == ["t0/0", "t0/1"]


def test_an_unknown_sort_is_refused(built: Path) -> None:
    with (
        EpisodeStore.open(built.run, create=False) as store,
        pytest.raises(ValueError, match="sort"),
    ):
        browse.episode_page(store, browse.EpisodeFilter(), sort="random")
