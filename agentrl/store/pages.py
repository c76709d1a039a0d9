"""Reading the episode list in pages: constant memory over a store of any size.

:meth:`EpisodeStore.episodes` returns every matching row at once, ordered by when each
episode attempt was last updated (a sort over the whole table); that suits a listing on
a terminal. :func:`episode_pages` yields the same rows, with the same filters and the
same token summary, a page at a time in the order the attempts started (SQLite's rowid
of ``episodes``), each page one indexed query: what an export of 100,000 episodes
iterates.

In: an open :class:`~agentrl.store.EpisodeStore` and the filters of
:meth:`EpisodeStore.episodes`. Out: lists of row dicts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from agentrl.store.listing import episode_filter, summarize_unfinished, within_version_span

if TYPE_CHECKING:
    from agentrl.store.episodes import EpisodeStore

PAGE_SIZE = 500
"""Episode rows per query: a few hundred kilobytes of summaries."""

_PAGE_SQL = (
    "SELECT e.*, COALESCE(SUM(t.num_tokens), 0) AS tokens, "
    "COALESCE(SUM(t.num_sampled), 0) AS sampled, MIN(NULLIF(t.min_version, -1)) AS "
    "v_min, MAX(t.max_version) AS v_max, p.version AS paused_version "
    "FROM (SELECT rowid AS row_number, * FROM episodes e WHERE {where} ORDER BY rowid "
    "LIMIT ?) e LEFT JOIN trajectories t ON t.episode_id = e.episode_id "
    "AND t.attempt = e.attempt LEFT JOIN partials p ON p.episode_id = e.episode_id "
    "AND p.attempt = e.attempt GROUP BY e.row_number ORDER BY e.row_number"
)


def episode_pages(
    store: EpisodeStore,
    *,
    state: str | Sequence[str] | None = None,
    env_id: str | None = None,
    min_reward: float | None = None,
    max_reward: float | None = None,
    min_version_span: int | None = None,
    limit: int | None = None,
    page_size: int = PAGE_SIZE,
) -> Iterator[list[dict[str, Any]]]:
    """The rows of :meth:`EpisodeStore.episodes`, ``page_size`` at a time, in start order.

    ``limit`` counts the rows that pass every filter (``min_version_span`` included).
    """
    where, args = episode_filter(state, env_id, min_reward, max_reward)
    after, left = 0, limit
    while left is None or left > 0:
        sql = _PAGE_SQL.format(where=" AND ".join(["e.rowid > ?", *where]))
        rows = [dict(r) for r in store._query(sql, [after, *args, page_size])]
        if not rows:
            return
        after = rows[-1]["row_number"]
        for r in rows:
            del r["row_number"]
            if r["state"] in ("running", "paused"):
                summarize_unfinished(r, store.partial(r["episode_id"]))
        rows = within_version_span(rows, min_version_span)
        if left is not None:
            rows, left = rows[:left], left - min(left, len(rows))
        if rows:
            yield rows
