"""Accounting over an episode store: the audit (nothing lost, nothing trained twice) and
the statistics (counts by state, bytes of token arrays).

Read-only queries over an open :class:`~agentrl.store.EpisodeStore`, returned as plain
JSON-ready dicts (``agentrl audit``, ``agentrl stats`` and the fault tests print them).
Which episodes count is decided once, in :mod:`agentrl.store.schema`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentrl.store.schema import ended_run_episode, run_episode

if TYPE_CHECKING:
    import sqlite3

    from agentrl.store.episodes import EpisodeStore

    Query = Callable[[str], list[sqlite3.Row]]


def audit_store(store: EpisodeStore) -> dict[str, Any]:
    """Account for every task: finished, failed with a reason, or still resumable.

    Returns counts by state and two lists that must be empty: ``lost`` (a trained
    task with fewer ended episodes than its group, an ended trajectory of a trained
    task the trainer never consumed, a failed episode without a reason) and
    ``trained_twice`` (a task consumed in more than one optimizer step, an episode
    segment consumed more than once). ``ok`` is True when both are empty.
    """
    q: Query = store._query
    tasks = _counts(q, "SELECT state, COUNT(*) AS n FROM tasks GROUP BY state")
    episodes = _counts(
        q,
        f"SELECT e.state, COUNT(*) AS n FROM episodes e WHERE {run_episode('e')} GROUP BY e.state",
    )
    lost, twice = _lost(q), _trained_twice(q)
    return {
        "tasks": sum(tasks.values()),
        "tasks_by_state": tasks,
        "episodes_by_state": episodes,
        "trained_tasks": tasks.get("trained", 0),
        "resumable_tasks": tasks.get("pending", 0) + tasks.get("complete", 0),
        "partials": len(q("SELECT episode_id FROM partials")),
        "consumed_steps": store.last_step(),
        "lost": lost,
        "trained_twice": twice,
        "ok": not lost and not twice,
    }


def store_stats(store: EpisodeStore) -> dict[str, Any]:
    """Counts by state (all episodes, replays too) and the bytes the token arrays take."""
    q: Query = store._query
    row = q(
        "SELECT COALESCE(SUM(num_tokens), 0) AS tokens, COALESCE(SUM(LENGTH(token_ids) + "
        "LENGTH(logprobs) + LENGTH(versions) + LENGTH(loss_mask)), 0) AS bytes "
        "FROM trajectories"
    )[0]
    return {
        "tasks": _counts(q, "SELECT state, COUNT(*) AS n FROM tasks GROUP BY state"),
        "episodes": _counts(q, "SELECT state, COUNT(*) AS n FROM episodes GROUP BY state"),
        "tokens": row["tokens"],
        "array_bytes": row["bytes"],
    }


def _counts(q: Query, sql: str) -> dict[str, int]:
    """``{state: n}`` from a query selecting ``state`` and ``n``."""
    return {r["state"]: r["n"] for r in q(sql)}


def _lost(q: Query) -> list[str]:
    """What the run recorded but did not carry through: each a sentence naming it."""
    lost = [
        f"task {r['task_id']} was trained with {r['n']} of {r['group_size']} episodes"
        for r in q(
            "SELECT k.task_id, k.group_size, COUNT(DISTINCT e.episode_id) AS n FROM tasks k "
            f"LEFT JOIN episodes e ON e.task_id = k.task_id AND {ended_run_episode('e')} "
            "WHERE k.state = 'trained' GROUP BY k.task_id HAVING n < k.group_size"
        )
    ]
    lost += [
        f"trajectory {r['traj_id']} (episode {r['episode_id']}) of trained task "
        f"{r['task_id']} was never consumed"
        for r in q(
            "SELECT t.traj_id, t.episode_id, t.task_id FROM trajectories t "
            "JOIN tasks k ON k.task_id = t.task_id AND k.state = 'trained' "
            "JOIN episodes e ON e.episode_id = t.episode_id AND e.attempt = t.attempt "
            f"WHERE {ended_run_episode('e')} "
            "AND t.traj_id NOT IN (SELECT traj_id FROM consumed)"
        )
    ]
    lost += [
        f"episode {r['episode_id']} attempt {r['attempt']} failed without a reason"
        for r in q(
            f"SELECT e.episode_id, e.attempt FROM episodes e WHERE {run_episode('e')} "
            "AND e.state = 'failed' AND e.reason = ''"
        )
    ]
    return lost


def _trained_twice(q: Query) -> list[str]:
    """Tasks and episode segments the trainer consumed more than once."""
    twice = [
        f"task {r['task_id']} was trained in steps {r['steps']}"
        for r in q(
            "SELECT t.task_id, GROUP_CONCAT(DISTINCT c.step) AS steps FROM consumed c "
            "JOIN trajectories t ON t.traj_id = c.traj_id GROUP BY t.task_id "
            "HAVING COUNT(DISTINCT c.step) > 1"
        )
    ]
    twice += [
        f"episode {r['episode_id']} segment {r['segment']} was trained {r['n']} times"
        for r in q(
            "SELECT t.episode_id, t.segment, COUNT(*) AS n FROM consumed c "
            "JOIN trajectories t ON t.traj_id = c.traj_id "
            "GROUP BY t.episode_id, t.segment HAVING n > 1"
        )
    ]
    return twice


__all__ = ["audit_store", "store_stats"]
