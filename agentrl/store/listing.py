"""What the episode listings share: their filters and each row's token summary.

:meth:`EpisodeStore.episodes <agentrl.store.EpisodeStore.episodes>` (every row at once)
and :func:`~agentrl.store.pages.episode_pages` (a page at a time) filter episode
attempts the same way (:func:`episode_filter`, :func:`within_version_span`) and give
each the same summary: its tokens, sampled tokens and version range, read from its
trajectories, or for an unfinished one from its checkpoint (:func:`summarize_unfinished`).

In: filter values, row dicts, a checkpoint. Out: SQL conditions and the rows filled in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrl.types import PartialEpisode

EPISODES_SQL = (
    "SELECT e.*, COALESCE(SUM(t.num_tokens), 0) AS tokens, "
    "COALESCE(SUM(t.num_sampled), 0) AS sampled, MIN(NULLIF(t.min_version, -1)) AS "
    "v_min, MAX(t.max_version) AS v_max, p.version AS paused_version "
    "FROM episodes e LEFT JOIN trajectories t ON t.episode_id = e.episode_id "
    "AND t.attempt = e.attempt LEFT JOIN partials p ON p.episode_id = e.episode_id "
    "AND p.attempt = e.attempt{where} GROUP BY e.episode_id, e.attempt ORDER BY e.updated_at"
)
"""Every episode attempt with its summary, ordered by its last update; ``{where}`` is
empty or `` WHERE`` and the conditions of :func:`episode_filter`."""


def episode_filter(
    state: str | Sequence[str] | None,
    env_id: str | None,
    min_reward: float | None,
    max_reward: float | None,
) -> tuple[list[str], list[Any]]:
    """The WHERE conditions (on ``episodes e``) and their arguments."""
    where: list[str] = []
    args: list[Any] = []
    if state is not None:
        states = [state] if isinstance(state, str) else list(state)
        where.append(f"e.state IN ({','.join('?' * len(states))})")
        args.extend(states)
    if env_id is not None:
        where.append("e.env_id = ?")
        args.append(env_id)
    if min_reward is not None:
        where.append("e.reward >= ?")
        args.append(min_reward)
    if max_reward is not None:
        where.append("e.reward <= ?")
        args.append(max_reward)
    return where, args


def summarize_unfinished(row: dict[str, Any], partial: PartialEpisode | None) -> None:
    """Fill an unfinished episode's token summary from its checkpoint, if it has one
    (``partial``, the store's checkpoint of ``row``'s episode)."""
    if partial is None or partial.attempt != row["attempt"]:
        return
    arrays = partial.concatenated()
    mask = arrays["loss_mask"].astype(bool)
    row["tokens"], row["sampled"] = len(arrays["token_ids"]), int(mask.sum())
    v = arrays["versions"][mask]
    row["v_min"], row["v_max"] = (int(v.min()), int(v.max())) if len(v) else (None, None)


def within_version_span(rows: list[dict[str, Any]], span: int | None) -> list[dict[str, Any]]:
    """The rows whose sampled tokens span at least ``span`` policy versions (all if None)."""
    if span is None:
        return rows
    return [r for r in rows if r["v_min"] is not None and r["v_max"] - r["v_min"] >= span]
