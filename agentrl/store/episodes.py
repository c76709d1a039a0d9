"""``EpisodeStore``: reading and writing the run's record (tasks, episodes, training).

Owns the one SQLite connection of a store, its lock and its write transactions, and
every read and write of runs, tasks, episodes, checkpoints (partials), trajectories,
groups, consumption by the trainer, and weight versions. Takes and returns the types of
:mod:`agentrl.types`. The schema, codecs and row decoders live in
:mod:`agentrl.store.schema`; the groups, consumption and versions in
:mod:`agentrl.store.training`; the audit and the statistics in :mod:`agentrl.store.audit`;
batched writing off the event loop in :mod:`agentrl.store.writer`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from agentrl.errors import StoreError
from agentrl.store.audit import audit_store, store_stats
from agentrl.store.listing import (
    EPISODES_SQL,
    episode_filter,
    summarize_unfinished,
    within_version_span,
)
from agentrl.store.schema import (
    RUN_ORIGIN,
    STORE_FILE,
    PartialRow,
    columns_of,
    connect,
    dump_json,
    ended_run_episode,
    partial_from_row,
    task_from_row,
    trajectory_from_row,
)
from agentrl.store.training import TrainingRecord
from agentrl.types import PartialEpisode, Task, Trajectory


class EpisodeStore(TrainingRecord):
    """The run's durable record. Open with :meth:`open`; close with :meth:`close`.

    Raises:
        StoreError: the file is not an agentrl store, is corrupt, or was written by a
            newer agentrl (names the file and what to do).
    """

    def __init__(self, connection: sqlite3.Connection, path: Path) -> None:
        self._db = connection
        self.path = path
        self._lock = threading.RLock()
        self._depth = 0

    # -- opening -----------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | Path, *, create: bool = True) -> EpisodeStore:
        """Open the store at ``path`` (a file, or a run directory holding ``episodes.db``)."""
        path = Path(path)
        if path.is_dir() or (not path.suffix and not path.exists()):
            path = path / STORE_FILE
        if not path.exists():
            if not create:
                raise StoreError(f"no episode store at {str(path)!r}; is this a run directory?")
            path.parent.mkdir(parents=True, exist_ok=True)
        writable = os.access(path.parent, os.W_OK) and (
            not path.exists() or os.access(path, os.W_OK)
        )
        if create and not writable:
            raise StoreError(
                f"the episode store {str(path)!r} is not writable (a read-only file system or "
                f"no permission); nothing was changed. Make {str(path.parent)!r} writable, "
                f"then run the command again"
            )
        return cls(connect(path, create=create), path)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> EpisodeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (nested calls join it); failures become StoreError."""
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield self._db
                finally:
                    self._depth -= 1
                return
            try:
                self._db.execute("BEGIN IMMEDIATE")
                self._depth = 1
                try:
                    yield self._db
                except BaseException:
                    # SQLite may have rolled back already (a full disk can): a second
                    # ROLLBACK would fail and hide the error that matters
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
                finally:
                    self._depth = 0
                self._db.execute("COMMIT")
            except sqlite3.OperationalError as e:
                raise StoreError(
                    f"writing the episode store {str(self.path)!r} failed: {e}; check that its "
                    f"directory is writable and the disk has space, then rerun with --resume"
                ) from e

    def batch(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """Group several writes into one transaction: ``with store.batch(): ...``."""
        return self._tx()

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            cur = self._db.execute(sql, args)
            cur.row_factory = sqlite3.Row
            return cur.fetchall()

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check`` ('ok' when the file is sound)."""
        return str(self._query("PRAGMA integrity_check")[0][0])

    # -- runs and tasks ----------------------------------------------------------------

    def begin_run(self, kind: str, config: dict[str, Any]) -> int:
        """Record a start (or restart) of the run with its config; return its id."""
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO runs (kind, started_at, config) VALUES (?, ?, ?)",
                (kind, time.time(), dump_json(config)),
            )
            return int(cur.lastrowid or 0)

    def runs(self) -> list[dict[str, Any]]:
        rows = self._query("SELECT * FROM runs ORDER BY run_id")
        return [{**dict(r), "config": json.loads(r["config"])} for r in rows]

    def first_config(self) -> dict[str, Any] | None:
        rows = self._query("SELECT config FROM runs ORDER BY run_id LIMIT 1")
        return json.loads(rows[0]["config"]) if rows else None

    def add_tasks(self, tasks: Iterable[Task], group_size: int) -> int:
        """Record tasks (known ones are left as they are); return how many were new."""
        return self.add_sized_tasks([(task, group_size) for task in tasks])

    def add_sized_tasks(self, tasks: Sequence[tuple[Task, int]]) -> int:
        """:meth:`add_tasks` for ``(task, group_size)`` pairs, in order, in one statement
        run for all of them (``executemany``: the store writer's batches). Each new task
        takes the next position (the largest so far, through its index, plus one)."""
        rows = [
            (
                task.task_id,
                task.env_id,
                task.seed,
                None if task.options is None else dump_json(task.options),
                dump_json(task.env_kwargs),
                group_size,
            )
            for task, group_size in tasks
        ]
        if not rows:
            return 0
        with self._tx() as db:
            cur = db.executemany(
                "INSERT OR IGNORE INTO tasks (task_id, position, env_id, seed, options, "
                "env_kwargs, group_size) VALUES (?, (SELECT COALESCE(MAX(position), -1) + 1 "
                "FROM tasks), ?, ?, ?, ?, ?)",
                rows,
            )
            return cur.rowcount

    def tasks(self, state: str | None = None) -> list[Task]:
        """Tasks in the order they were added (optionally only those in ``state``)."""
        sql = "SELECT * FROM tasks" + (" WHERE state = ?" if state else "") + " ORDER BY position"
        return [task_from_row(r) for r in self._query(sql, (state,) if state else ())]

    def task_states(self) -> dict[str, str]:
        return {r["task_id"]: r["state"] for r in self._query("SELECT task_id, state FROM tasks")}

    def group_size(self, task_id: str) -> int:
        rows = self._query("SELECT group_size FROM tasks WHERE task_id = ?", (task_id,))
        if not rows:
            raise KeyError(f"task {task_id!r} is not in the store")
        return int(rows[0]["group_size"])

    # -- episodes ----------------------------------------------------------------------

    def episode_started(self, episode_id: str, task: Task, attempt: int, version: int) -> None:
        self.episodes_started([(episode_id, task, attempt, version)])

    def episodes_started(self, starts: Sequence[tuple[str, Task, int, int]]) -> None:
        """Record ``(episode_id, task, attempt, version)`` attempts as running, in order,
        in one statement run for all of them (``executemany``)."""
        now = time.time()
        with self._tx() as db:
            db.executemany(
                "INSERT INTO episodes (episode_id, attempt, task_id, env_id, state, "
                "started_version, updated_at) VALUES (?, ?, ?, ?, 'running', ?, ?) "
                "ON CONFLICT (episode_id, attempt) DO UPDATE SET state = 'running', "
                "updated_at = excluded.updated_at",
                [
                    (episode_id, attempt, task.task_id, task.env_id, version, now)
                    for episode_id, task, attempt, version in starts
                ],
            )

    def save_partials(self, partials: Sequence[PartialEpisode | PartialRow]) -> None:
        """Checkpoint unfinished episodes, all in one transaction (replacing older ones).

        Each is a :class:`PartialEpisode` or the same already encoded (:class:`PartialRow`).
        """
        if not partials:
            return
        now = time.time()
        rows = [p if isinstance(p, PartialRow) else PartialRow.of(p) for p in partials]
        with self._tx() as db:  # executemany: one statement loop in C for the batch
            db.executemany(
                "INSERT OR REPLACE INTO partials (episode_id, attempt, version, written_at, "
                "token_ids, logprobs, versions, loss_mask, meta) VALUES (?,?,?,?,?,?,?,?,?)",
                [(r.episode_id, r.attempt, r.version, now, *r.columns) for r in rows],
            )
            db.executemany(
                "UPDATE episodes SET state = 'paused', updated_at = ? "
                "WHERE episode_id = ? AND attempt = ?",
                [(now, r.episode_id, r.attempt) for r in rows],
            )

    def partial(self, episode_id: str) -> PartialEpisode | None:
        rows = self._query("SELECT * FROM partials WHERE episode_id = ?", (episode_id,))
        return partial_from_row(rows[0]) if rows else None

    def partials(self) -> list[PartialEpisode]:
        rows = self._query("SELECT * FROM partials ORDER BY written_at")
        return [partial_from_row(r) for r in rows]

    def save_episode(
        self,
        trajectories: Sequence[Trajectory],
        *,
        retried: bool = False,
        origin: str = RUN_ORIGIN,
    ) -> None:
        """Record an ended episode attempt (all its segments) and drop its checkpoint.

        ``retried``: a failed attempt that will be run again (kept for the record, never
        trained). ``origin``: ``run``, or ``replay`` for episodes resumed or forked while
        debugging (never trained, never part of a group).
        """
        self.save_episodes([(trajectories, retried)], origin=origin)

    def save_episodes(
        self,
        episodes: Sequence[tuple[Sequence[Trajectory], bool]],
        *,
        origin: str = RUN_ORIGIN,
    ) -> None:
        """:meth:`save_episode` for several ended attempts ``(trajectories, retried)``, in
        one transaction, in order: each statement runs once for all of them
        (``executemany``), which the store writer uses for a batch of episode ends."""
        if not episodes:
            return
        now = time.time()
        segments: list[tuple[Any, ...]] = []
        ends: list[tuple[Any, ...]] = []
        for trajectories, retried in episodes:
            first = trajectories[0]
            first_lo = None
            for t in trajectories:
                columns = columns_of(t)
                first_lo = columns[0] if first_lo is None else first_lo
                segments.append(
                    (
                        t.episode_id,
                        t.attempt,
                        t.segment,
                        t.task_id,
                        t.env_id,
                        t.status,
                        t.reward,
                        *columns,
                        now,
                    )
                )
            # started_version: the first segment's oldest sampled version (as it was)
            ends.append(
                (
                    first.episode_id,
                    first.attempt,
                    first.task_id,
                    first.env_id,
                    "retried" if retried else first.status,
                    first_lo,
                    now,
                    first.reward,
                    first.reason,
                    origin,
                )
            )
        with self._tx() as db:
            db.executemany(
                "INSERT OR REPLACE INTO trajectories (episode_id, attempt, segment, task_id, "
                "env_id, status, reward, min_version, max_version, num_tokens, num_sampled, "
                "token_ids, logprobs, versions, loss_mask, meta, created_at) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                segments,
            )
            db.executemany(
                "INSERT INTO episodes (episode_id, attempt, task_id, env_id, state, "
                "started_version, updated_at, reward, reason, origin) "
                "VALUES (?,?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT (episode_id, attempt) DO UPDATE SET state = excluded.state, "
                "updated_at = excluded.updated_at, reward = excluded.reward, "
                "reason = excluded.reason",
                ends,
            )
            db.executemany("DELETE FROM partials WHERE episode_id = ?", [(e[0],) for e in ends])

    def drop_episode(self, episode_id: str, attempt: int, reason: str) -> None:
        """Record that an unfinished attempt was discarded (it will be run again)."""
        with self._tx() as db:
            db.execute(
                "UPDATE episodes SET state = 'dropped', reason = ?, updated_at = ? "
                "WHERE episode_id = ? AND attempt = ?",
                (reason, time.time(), episode_id, attempt),
            )
            db.execute("DELETE FROM partials WHERE episode_id = ?", (episode_id,))

    def ended_episodes(self, task_id: str) -> dict[str, list[Trajectory]]:
        """The final (not retried) trajectories of a task's ended episodes, by episode id."""
        rows = self._query(
            "SELECT t.* FROM trajectories t JOIN episodes e ON e.episode_id = t.episode_id "
            f"AND e.attempt = t.attempt WHERE t.task_id = ? AND {ended_run_episode('e')} "
            "ORDER BY t.episode_id, t.segment",
            (task_id,),
        )
        out: dict[str, list[Trajectory]] = {}
        for r in rows:
            out.setdefault(r["episode_id"], []).append(trajectory_from_row(r))
        return out

    def next_attempt(self, episode_id: str) -> int:
        rows = self._query(
            "SELECT COALESCE(MAX(attempt) + 1, 0) AS n FROM episodes WHERE episode_id = ?",
            (episode_id,),
        )
        return int(rows[0]["n"])

    def episodes(
        self,
        *,
        state: str | Sequence[str] | None = None,
        env_id: str | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        min_version_span: int | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Episode attempts with their state and token summary, filtered."""
        where, args = episode_filter(state, env_id, min_reward, max_reward)
        sql = EPISODES_SQL.format(where=" WHERE " + " AND ".join(where) if where else "")
        rows = [dict(r) for r in self._query(sql, args)]
        for r in rows:
            if r["state"] in ("running", "paused"):
                summarize_unfinished(r, self.partial(r["episode_id"]))
        rows = within_version_span(rows, min_version_span)
        return rows[:limit] if limit is not None else rows

    def trajectories(self, episode_id: str, attempt: int | None = None) -> list[Trajectory]:
        """An episode's segments (its latest attempt unless ``attempt`` is given)."""
        if attempt is None:
            attempt = self.next_attempt(episode_id) - 1
        rows = self._query(
            "SELECT * FROM trajectories WHERE episode_id = ? AND attempt = ? ORDER BY segment",
            (episode_id, attempt),
        )
        return [trajectory_from_row(r) for r in rows]

    def all_trajectories(self, *, include_retried: bool = False) -> Iterator[Trajectory]:
        sql = (
            "SELECT t.* FROM trajectories t JOIN episodes e ON e.episode_id = t.episode_id "
            "AND e.attempt = t.attempt"
            + ("" if include_retried else f" WHERE {ended_run_episode('e')}")
            + " ORDER BY t.traj_id"
        )
        for r in self._query(sql):
            yield trajectory_from_row(r)

    # -- accounting (see agentrl.store.audit) ----------------------------------------------

    def audit(self) -> dict[str, Any]:
        """Account for every task; see :func:`agentrl.store.audit.audit_store`."""
        return audit_store(self)

    def stats(self) -> dict[str, Any]:
        """Counts by state and the bytes the token arrays take."""
        return store_stats(self)
