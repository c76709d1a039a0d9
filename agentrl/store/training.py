"""The training side of the run's record: complete groups, what the trainer consumed at
each optimizer step (rolled back on resume), and the published weight versions.

:class:`TrainingRecord` is a part of :class:`~agentrl.store.episodes.EpisodeStore` (its
base class): the store's connection, lock and transactions are the store's.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.store.schema import dump_json, ended_run_episode
from agentrl.types import Group, Task, Trajectory


class TrainingRecord:
    """Groups, consumption and versions of :class:`~agentrl.store.episodes.EpisodeStore`,
    which provides these."""

    _tx: Callable[[], contextlib.AbstractContextManager[sqlite3.Connection]]
    _query: Callable[..., list[sqlite3.Row]]
    tasks: Callable[..., list[Task]]
    ended_episodes: Callable[[str], dict[str, list[Trajectory]]]
    group_size: Callable[[str], int]

    # -- groups and training ------------------------------------------------------------

    def complete_group(self, group: Group) -> None:
        """Mark a task's group complete (all its episodes ended): ready to train."""
        self.complete_groups([group])

    def complete_groups(self, groups: Sequence[Group]) -> None:
        """:meth:`complete_group` for several, in one statement run (``executemany``)."""
        with self._tx() as db:
            db.executemany(
                "UPDATE tasks SET state = 'complete' WHERE task_id = ? AND state = 'pending'",
                [(group.task.task_id,) for group in groups],
            )

    def untrained_groups(self) -> list[Group]:
        """Complete groups whose trajectories the trainer has not consumed, in task order."""
        groups = []
        for task in self.tasks(state="complete"):
            episodes = self.ended_episodes(task.task_id)
            trajectories = [t for ts in episodes.values() for t in ts]
            groups.append(Group(task, self.group_size(task.task_id), trajectories))
        return groups

    def mark_consumed(self, groups: Sequence[Group], step: int) -> None:
        """Record that the trainer used these groups in optimizer step ``step``."""
        now = time.time()
        with self._tx() as db:
            for group in groups:
                row = db.execute(
                    "SELECT state FROM tasks WHERE task_id = ?", (group.task.task_id,)
                ).fetchone()
                if row is None or row[0] != "complete":
                    raise ValueError(
                        f"task {group.task.task_id!r} cannot be trained at step {step}: its "
                        f"state is {row[0] if row else 'unknown'!r} (only complete, untrained "
                        f"groups can be consumed, and only once)"
                    )
                db.execute(
                    "INSERT INTO consumed (traj_id, step, at) SELECT t.traj_id, ?, ? FROM "
                    "trajectories t JOIN episodes e ON e.episode_id = t.episode_id AND "
                    f"e.attempt = t.attempt WHERE t.task_id = ? AND {ended_run_episode('e')}",
                    (step, now, group.task.task_id),
                )
                db.execute(
                    "UPDATE tasks SET state = 'trained' WHERE task_id = ?", (group.task.task_id,)
                )

    def rollback_consumed(self, step: int) -> int:
        """Forget consumption recorded after optimizer step ``step``; return groups reopened.

        A resumed trainer restores its last checkpoint (at ``step``); steps after it
        never happened as far as the model knows, so their groups are trained again.
        """
        with self._tx() as db:
            cur = db.execute(
                "UPDATE tasks SET state = 'complete' WHERE state = 'trained' AND task_id IN "
                "(SELECT t.task_id FROM consumed c JOIN trajectories t ON t.traj_id = c.traj_id "
                "WHERE c.step > ?)",
                (step,),
            )
            db.execute("DELETE FROM consumed WHERE step > ?", (step,))
            return cur.rowcount

    def consumed(self) -> list[dict[str, Any]]:
        rows = self._query(
            "SELECT c.step, c.traj_id, t.task_id, t.episode_id, t.segment FROM consumed c "
            "JOIN trajectories t ON t.traj_id = c.traj_id ORDER BY c.step, c.traj_id"
        )
        return [dict(r) for r in rows]

    def last_step(self) -> int:
        rows = self._query("SELECT COALESCE(MAX(step), -1) AS s FROM consumed")
        return int(rows[0]["s"])

    # -- versions ----------------------------------------------------------------------

    def record_version(
        self, version: int, kind: str, source: str, stats: dict[str, Any] | None = None
    ) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO versions (version, published_at, kind, source, stats) "
                "VALUES (?, ?, ?, ?, ?)",
                (version, time.time(), kind, source, dump_json(stats or {})),
            )

    def versions(self) -> list[dict[str, Any]]:
        rows = self._query("SELECT * FROM versions ORDER BY version")
        return [{**dict(r), "stats": json.loads(r["stats"])} for r in rows]
