"""episode_pages: the rows of EpisodeStore.episodes, a page at a time, same filters."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.store import EpisodeStore
from agentrl.store.pages import episode_pages
from agentrl.types import TokenSpan, Trajectory

pytestmark = pytest.mark.timeout(30)


def _trajectory(i: int) -> Trajectory:
    version = i % 3
    return Trajectory(
        episode_id=f"e{i}",
        task_id=f"t{i}",
        env_id=f"env{i % 2}",
        seed=i,
        token_ids=[1, 2, 3],
        logprobs=[float("nan"), -0.5, -0.1],
        versions=[-1, 0, version],
        loss_mask=[0, 1, 1],
        spans=(TokenSpan("prompt", 0, 1, 0), TokenSpan("assistant", 1, 3, 0)),
        messages=[],
        turn_rewards=[i / 10],
        reward=i / 10,
        status="finished",
    )


@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"env_id": "env1"},
        {"min_reward": 0.5, "max_reward": 1.5},
        {"min_version_span": 2},
        {"limit": 7},
        {"state": ["finished"], "limit": 0},
        {"min_version_span": 1, "limit": 4},
    ],
)
def test_pages_hold_the_rows_of_episodes(tmp_path: Path, filters: dict) -> None:
    from agentrl.types import Task

    with EpisodeStore.open(tmp_path / "run") as store:
        trajectories = [_trajectory(i) for i in range(23)]
        store.add_tasks([Task(t.task_id, t.env_id, i) for i, t in enumerate(trajectories)], 1)
        for i, t in enumerate(trajectories):
            store.episode_started(t.episode_id, Task(t.task_id, t.env_id, i), 0, 0)
        store.save_episodes([([t], False) for t in trajectories])
        pages = list(episode_pages(store, page_size=5, **filters))
        assert all(0 < len(p) <= 5 for p in pages)
        got = [r for p in pages for r in p]
        unlimited = {k: v for k, v in filters.items() if k != "limit"}
        want = sorted(store.episodes(**unlimited), key=lambda r: int(r["episode_id"][1:]))
        want = want[: filters["limit"]] if "limit" in filters else want
        assert got == want
        assert got or filters.get("limit") == 0
