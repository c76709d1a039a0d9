"""Paged, filtered reads of a store for viewers: one page of episodes, an episode's
attempts, its forks, and each optimizer step's cohort.

:meth:`EpisodeStore.episodes` returns every matching attempt (what ``agentrl replay``
lists); a viewer over a store of 100,000 episodes needs one page of them, so the
paging, the filters and the per-episode token summary all run in SQL here: the page of
``episodes`` rows is picked first (LIMIT/OFFSET on the filtered table), and only its
rows are joined with their trajectories. Only reads; the store is opened by the caller
(read-only: ``EpisodeStore.open(path, create=False)``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from agentrl.store.schema import ARRAY_DTYPES, decode_array, run_episode
from agentrl.types import FailureKind

if TYPE_CHECKING:
    from agentrl.store.episodes import EpisodeStore

SORTS = {"newest": "rid", "updated": "updated_at", "reward": "reward", "episode": "episode_id"}
"""Orders a page can be sorted by, descending: ``newest`` (the order attempts started:
SQLite's rowid, so a page deep in 100,000 episodes needs no sort), last updated,
reward, episode id."""


@dataclasses.dataclass(frozen=True, slots=True)
class EpisodeFilter:
    """Which episodes a page holds (every field optional; None: no condition)."""

    state: str | None = None
    env_id: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    min_version_span: int | None = None
    """Sampled versions spanning at least this many updates (newest minus oldest)."""
    failure: str | None = None
    """A :class:`~agentrl.types.FailureKind` value (failed episodes of that kind)."""
    attempt: int | None = None
    origin: str | None = None
    """``run`` or ``replay`` (resumed and forked while debugging)."""

    def where(self) -> tuple[str, list[Any]]:
        """The WHERE clause (on ``episodes e``) and its arguments."""
        conditions: list[str] = []
        args: list[Any] = []
        for sql, value in (
            ("e.state = ?", self.state),
            ("e.env_id = ?", self.env_id),
            ("e.reward >= ?", self.min_reward),
            ("e.reward <= ?", self.max_reward),
            ("e.attempt = ?", self.attempt),
            ("e.origin = ?", self.origin),
        ):
            if value is not None:
                conditions.append(sql)
                args.append(value)
        if self.min_version_span is not None:
            conditions.append(
                "(SELECT MAX(t.max_version) - MIN(NULLIF(t.min_version, -1)) FROM trajectories t "
                "WHERE t.episode_id = e.episode_id AND t.attempt = e.attempt) >= ?"
            )
            args.append(self.min_version_span)
        if self.failure is not None:
            conditions.append(
                "EXISTS (SELECT 1 FROM trajectories t WHERE t.episode_id = e.episode_id AND "
                "t.attempt = e.attempt AND json_extract(t.meta, '$.failure') = ?)"
            )
            args.append(self.failure)
        return (" WHERE " + " AND ".join(conditions) if conditions else ""), args


def episode_page(
    store: EpisodeStore,
    where: EpisodeFilter,
    *,
    limit: int = 50,
    offset: int = 0,
    sort: str = "newest",
) -> tuple[list[dict[str, Any]], int]:
    """One page of episode attempts matching ``where`` and how many match in all.

    Each row: the ``episodes`` columns plus ``tokens``, ``sampled``, ``turns``,
    ``v_min``/``v_max`` (sampled versions; None when nothing was sampled) and
    ``failure``. Unfinished attempts take their token counts from their checkpoint.
    """
    if sort not in SORTS:
        raise ValueError(f"sort {sort!r} is not one of {sorted(SORTS)}")
    clause, args = where.where()
    total = int(store._query(f"SELECT COUNT(*) AS n FROM episodes e{clause}", args)[0]["n"])
    sql = (
        "SELECT p.*, COALESCE(SUM(t.num_tokens), LENGTH(c.token_ids) / 4, 0) AS tokens, "
        "COALESCE(SUM(t.num_sampled), 0) AS sampled, MIN(NULLIF(t.min_version, -1)) AS v_min, "
        "NULLIF(MAX(t.max_version), -1) AS v_max, "
        "MAX(json_array_length(t.meta, '$.turn_starts')) AS turns, "
        "MAX(json_extract(t.meta, '$.failure')) AS failure, c.version AS paused_version "
        f"FROM (SELECT e.rowid AS rid, e.* FROM episodes e{clause} ORDER BY "
        f"{'e.rowid' if sort == 'newest' else 'e.' + SORTS[sort]} DESC, e.rowid DESC "
        "LIMIT ? OFFSET ?) p "
        "LEFT JOIN trajectories t ON t.episode_id = p.episode_id AND t.attempt = p.attempt "
        "LEFT JOIN partials c ON c.episode_id = p.episode_id AND c.attempt = p.attempt "
        f"GROUP BY p.rid ORDER BY p.{SORTS[sort]} DESC, p.rid DESC"
    )
    rows = [dict(r) for r in store._query(sql, [*args, limit, offset])]
    for row in rows:
        if row["paused_version"] is not None:
            _summarize_checkpoint(store, row)
    return rows, total


def _summarize_checkpoint(store: EpisodeStore, row: dict[str, Any]) -> None:
    """An unfinished attempt's sampled count and versions, from its checkpoint's arrays."""
    found = store._query(
        "SELECT versions, loss_mask FROM partials WHERE episode_id = ? AND attempt = ?",
        (row["episode_id"], row["attempt"]),
    )
    if not found:
        return
    mask = decode_array(found[0]["loss_mask"], ARRAY_DTYPES["loss_mask"]).astype(bool)
    versions = decode_array(found[0]["versions"], ARRAY_DTYPES["versions"])[mask]
    row["sampled"] = int(mask.sum())
    if len(versions):
        row["v_min"], row["v_max"] = int(versions.min()), int(versions.max())


def facets(store: EpisodeStore) -> dict[str, list[Any]]:
    """The values the filters can take in this store: states, envs and attempts (one scan
    of ``episodes``), and failure kinds (the closed set of :class:`FailureKind`)."""
    rows = store._query("SELECT DISTINCT state, env_id, attempt FROM episodes")
    return {
        "states": sorted({r["state"] for r in rows}),
        "envs": sorted({r["env_id"] for r in rows}),
        "attempts": sorted({r["attempt"] for r in rows}),
        "failures": [kind.value for kind in FailureKind],
    }


def attempts(store: EpisodeStore, episode_id: str) -> list[dict[str, Any]]:
    """Every attempt of an episode, oldest first, with its token count."""
    rows = store._query(
        "SELECT e.attempt, e.state, e.reward, e.reason, e.origin, e.started_version, "
        "e.updated_at, COALESCE(SUM(t.num_tokens), 0) AS tokens FROM episodes e "
        "LEFT JOIN trajectories t ON t.episode_id = e.episode_id AND t.attempt = e.attempt "
        "WHERE e.episode_id = ? GROUP BY e.attempt ORDER BY e.attempt",
        (episode_id,),
    )
    return [dict(r) for r in rows]


def derived(store: EpisodeStore, episode_id: str) -> list[str]:
    """Episodes resumed or forked from ``episode_id`` (``<id>~resumed-N``, ``<id>~fork@T-N``)."""
    pattern = episode_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "~%"
    rows = store._query(
        "SELECT DISTINCT episode_id FROM episodes WHERE episode_id LIKE ? ESCAPE '\\' "
        "ORDER BY episode_id",
        (pattern,),
    )
    return [r["episode_id"] for r in rows]


def cohorts(store: EpisodeStore, *, limit: int = 200) -> list[dict[str, Any]]:
    """Each optimizer step (newest first) with the episodes it trained on."""
    rows = store._query(
        "SELECT c.step, COUNT(*) AS trajectories, GROUP_CONCAT(DISTINCT t.episode_id) AS "
        "episodes, AVG(t.reward) AS reward_mean, SUM(t.num_sampled) AS sampled FROM consumed c "
        "JOIN trajectories t ON t.traj_id = c.traj_id GROUP BY c.step ORDER BY c.step DESC "
        "LIMIT ?",
        (limit,),
    )
    return [{**dict(r), "episodes": (r["episodes"] or "").split(",")} for r in rows]


def counts(store: EpisodeStore) -> dict[str, Any]:
    """Episodes by state (the run's own; replays apart), and the last trained step."""
    rows = store._query(
        f"SELECT state, COUNT(*) AS n FROM episodes e WHERE {run_episode('e')} GROUP BY state"
    )
    step = store._query("SELECT COALESCE(MAX(step), -1) AS s FROM consumed")[0]["s"]
    return {"episodes": {r["state"]: r["n"] for r in rows}, "last_step": int(step)}
