"""``EpisodeStore``: the durable record of a run, on SQLite in WAL mode.

The store is the source of truth. It holds:

* ``runs``: each start of the run (the first and every ``--resume``) with its config;
* ``tasks``: every task with its group size and state (``pending``, ``complete``,
  ``trained``);
* ``episodes``: one row per episode attempt, with its state (``running``, ``paused``,
  ``finished``, ``truncated``, ``failed``, ``retried``, ``dropped``);
* ``partials``: the latest snapshot of each unfinished episode (a
  :class:`~agentrl.types.PartialEpisode`), replaced at every checkpoint;
* ``trajectories``: finished episodes (and failed attempts) as token arrays;
* ``consumed``: which trajectories the trainer used, at which optimizer step;
* ``versions``: the weight-version history with the cost of each update.

Token arrays are stored as raw little-endian numpy bytes (int32 ids, float32
logprobs, int32 versions, int8 loss mask: 13 bytes per token); everything else is
JSON. Nothing is pickled, so opening a store never executes code. The schema version
is SQLite's ``user_version``; a store written by a newer schema is refused.

Durability: WAL with ``synchronous=NORMAL`` survives the process being killed at any
moment (a commit is in the WAL before it returns); only an OS crash or power loss
can lose the last commits. One connection, guarded by a lock, so the async
wrappers may run the calls in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentrl import faults
from agentrl.errors import StoreError
from agentrl.types import (
    Group,
    PartialEpisode,
    SegmentArrays,
    Task,
    Timings,
    TokenSpan,
    Trajectory,
)

SCHEMA_VERSION = 1
STORE_FILE = "episodes.db"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    started_at REAL NOT NULL,
    config TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    position INTEGER NOT NULL,
    env_id TEXT NOT NULL,
    seed INTEGER,
    options TEXT,
    env_kwargs TEXT NOT NULL,
    group_size INTEGER NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending'
);
CREATE TABLE IF NOT EXISTS episodes (
    episode_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    task_id TEXT NOT NULL REFERENCES tasks(task_id),
    env_id TEXT NOT NULL,
    state TEXT NOT NULL,
    started_version INTEGER NOT NULL,
    updated_at REAL NOT NULL,
    reward REAL,
    reason TEXT NOT NULL DEFAULT '',
    origin TEXT NOT NULL DEFAULT 'run',
    PRIMARY KEY (episode_id, attempt)
);
CREATE INDEX IF NOT EXISTS episodes_by_task ON episodes(task_id);
CREATE TABLE IF NOT EXISTS partials (
    episode_id TEXT PRIMARY KEY,
    attempt INTEGER NOT NULL,
    version INTEGER NOT NULL,
    written_at REAL NOT NULL,
    token_ids BLOB NOT NULL,
    logprobs BLOB NOT NULL,
    versions BLOB NOT NULL,
    loss_mask BLOB NOT NULL,
    meta TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS trajectories (
    traj_id INTEGER PRIMARY KEY,
    episode_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    segment INTEGER NOT NULL,
    task_id TEXT NOT NULL,
    env_id TEXT NOT NULL,
    status TEXT NOT NULL,
    reward REAL NOT NULL,
    min_version INTEGER NOT NULL,
    max_version INTEGER NOT NULL,
    num_tokens INTEGER NOT NULL,
    num_sampled INTEGER NOT NULL,
    token_ids BLOB NOT NULL,
    logprobs BLOB NOT NULL,
    versions BLOB NOT NULL,
    loss_mask BLOB NOT NULL,
    meta TEXT NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE (episode_id, attempt, segment)
);
CREATE INDEX IF NOT EXISTS trajectories_by_task ON trajectories(task_id);
CREATE TABLE IF NOT EXISTS consumed (
    traj_id INTEGER PRIMARY KEY REFERENCES trajectories(traj_id),
    step INTEGER NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS versions (
    version INTEGER PRIMARY KEY,
    published_at REAL NOT NULL,
    kind TEXT NOT NULL,
    source TEXT NOT NULL,
    stats TEXT NOT NULL
);
"""

FINAL_STATES = ("finished", "truncated", "failed")


def _blob(array: np.ndarray, dtype: str) -> bytes:
    return np.ascontiguousarray(array, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()


def _unblob(data: bytes, dtype: str) -> np.ndarray:
    return np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)


_DTYPES = {"token_ids": "int32", "logprobs": "float32", "versions": "int32", "loss_mask": "int8"}


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


class EpisodeStore:
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
        try:
            db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
            db.execute("PRAGMA busy_timeout = 30000")
            version = db.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as e:
            raise StoreError(
                f"{str(path)!r} is not a readable SQLite episode store ({e}); if it is "
                f"corrupt, restore it from a backup or start a new run directory"
            ) from e
        if version > SCHEMA_VERSION:
            db.close()
            raise StoreError(
                f"{str(path)!r} was written by a newer agentrl (store schema {version}; this "
                f"agentrl reads schema {SCHEMA_VERSION} and older); upgrade agentrl to open it"
            )
        try:
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            db.execute("PRAGMA foreign_keys = ON")
            if version == 0:
                tables = db.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
                if tables:
                    raise StoreError(
                        f"{str(path)!r} is a SQLite file but not an agentrl episode store "
                        f"(it has tables {[t[0] for t in tables][:5]}); choose another path"
                    )
                with db:
                    db.execute("BEGIN")
                    db.executescript(_SCHEMA)
                    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except sqlite3.DatabaseError as e:
            db.close()
            raise StoreError(
                f"{str(path)!r} is not a usable episode store ({e}); if it is corrupt, "
                f"restore it from a backup or start a new run directory"
            ) from e
        except StoreError:
            db.close()
            raise
        return cls(db, path)

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
                (kind, time.time(), _json(config)),
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
        with self._tx() as db:
            position = db.execute("SELECT COALESCE(MAX(position), -1) FROM tasks").fetchone()[0]
            added = 0
            for task in tasks:
                cur = db.execute(
                    "INSERT OR IGNORE INTO tasks (task_id, position, env_id, seed, options, "
                    "env_kwargs, group_size) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (task.task_id, position + 1, task.env_id, task.seed,
                     None if task.options is None else _json(task.options),
                     _json(task.env_kwargs), group_size),
                )  # fmt: skip
                if cur.rowcount:
                    position += 1
                    added += 1
            return added

    def tasks(self, state: str | None = None) -> list[Task]:
        """Tasks in the order they were added (optionally only those in ``state``)."""
        sql = "SELECT * FROM tasks" + (" WHERE state = ?" if state else "") + " ORDER BY position"
        return [_task(r) for r in self._query(sql, (state,) if state else ())]

    def task_states(self) -> dict[str, str]:
        return {r["task_id"]: r["state"] for r in self._query("SELECT task_id, state FROM tasks")}

    def group_size(self, task_id: str) -> int:
        rows = self._query("SELECT group_size FROM tasks WHERE task_id = ?", (task_id,))
        if not rows:
            raise KeyError(f"task {task_id!r} is not in the store")
        return int(rows[0]["group_size"])

    # -- episodes ----------------------------------------------------------------------

    def episode_started(self, episode_id: str, task: Task, attempt: int, version: int) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO episodes (episode_id, attempt, task_id, env_id, state, "
                "started_version, updated_at) VALUES (?, ?, ?, ?, 'running', ?, ?) "
                "ON CONFLICT (episode_id, attempt) DO UPDATE SET state = 'running', "
                "updated_at = excluded.updated_at",
                (episode_id, attempt, task.task_id, task.env_id, version, time.time()),
            )

    def save_partials(self, partials: Sequence[PartialEpisode]) -> None:
        """Checkpoint unfinished episodes, all in one transaction (replacing older ones)."""
        if not partials:
            return
        now = time.time()
        with self._tx() as db:
            for p in partials:
                arrays = p.concatenated()
                db.execute(
                    "INSERT OR REPLACE INTO partials (episode_id, attempt, version, written_at, "
                    "token_ids, logprobs, versions, loss_mask, meta) VALUES (?,?,?,?,?,?,?,?,?)",
                    (p.episode_id, p.attempt, p.version, now,
                     *(_blob(arrays[k], d) for k, d in _DTYPES.items()), _json(p.meta())),
                )  # fmt: skip
                db.execute(
                    "UPDATE episodes SET state = 'paused', updated_at = ? "
                    "WHERE episode_id = ? AND attempt = ?",
                    (now, p.episode_id, p.attempt),
                )

    def partial(self, episode_id: str) -> PartialEpisode | None:
        rows = self._query("SELECT * FROM partials WHERE episode_id = ?", (episode_id,))
        return _partial(rows[0]) if rows else None

    def partials(self) -> list[PartialEpisode]:
        return [_partial(r) for r in self._query("SELECT * FROM partials ORDER BY written_at")]

    def save_episode(
        self, trajectories: Sequence[Trajectory], *, retried: bool = False, origin: str = "run"
    ) -> None:
        """Record an ended episode attempt (all its segments) and drop its checkpoint.

        ``retried``: a failed attempt that will be run again (kept for the record, never
        trained). ``origin``: ``run``, or ``replay`` for episodes resumed or forked while
        debugging (never trained, never part of a group).
        """
        first = trajectories[0]
        now = time.time()
        state = "retried" if retried else first.status
        with self._tx() as db:
            for t in trajectories:
                sampled = t.versions[t.loss_mask.astype(bool)]
                db.execute(
                    "INSERT OR REPLACE INTO trajectories (episode_id, attempt, segment, task_id, "
                    "env_id, status, reward, min_version, max_version, num_tokens, num_sampled, "
                    "token_ids, logprobs, versions, loss_mask, meta, created_at) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (t.episode_id, t.attempt, t.segment, t.task_id, t.env_id, t.status, t.reward,
                     int(sampled.min()) if len(sampled) else -1,
                     int(sampled.max()) if len(sampled) else -1, len(t), t.num_sampled,
                     *(_blob(getattr(t, k), d) for k, d in _DTYPES.items()),
                     _json(_trajectory_meta(t)), now),
                )  # fmt: skip
            db.execute(
                "INSERT INTO episodes (episode_id, attempt, task_id, env_id, state, "
                "started_version, updated_at, reward, reason, origin) "
                "VALUES (?,?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT (episode_id, attempt) DO UPDATE SET state = excluded.state, "
                "updated_at = excluded.updated_at, reward = excluded.reward, "
                "reason = excluded.reason",
                (first.episode_id, first.attempt, first.task_id, first.env_id, state,
                 first.min_version(), now, first.reward, first.reason, origin),
            )  # fmt: skip
            db.execute("DELETE FROM partials WHERE episode_id = ?", (first.episode_id,))

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
            "AND e.attempt = t.attempt WHERE t.task_id = ? AND e.origin = 'run' AND e.state IN "
            "('finished', 'truncated', 'failed') ORDER BY t.episode_id, t.segment",
            (task_id,),
        )
        out: dict[str, list[Trajectory]] = {}
        for r in rows:
            out.setdefault(r["episode_id"], []).append(_trajectory(r))
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
        where, args = [], []
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
        sql = (
            "SELECT e.*, COALESCE(SUM(t.num_tokens), 0) AS tokens, "
            "COALESCE(SUM(t.num_sampled), 0) AS sampled, MIN(NULLIF(t.min_version, -1)) AS "
            "v_min, MAX(t.max_version) AS v_max, p.version AS paused_version "
            "FROM episodes e LEFT JOIN trajectories t ON t.episode_id = e.episode_id "
            "AND t.attempt = e.attempt LEFT JOIN partials p ON p.episode_id = e.episode_id "
            "AND p.attempt = e.attempt"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " GROUP BY e.episode_id, e.attempt ORDER BY e.updated_at"
        )
        rows = [dict(r) for r in self._query(sql, args)]
        for r in rows:
            if r["state"] in ("running", "paused"):
                p = self.partial(r["episode_id"])
                if p is not None and p.attempt == r["attempt"]:
                    arrays = p.concatenated()
                    mask = arrays["loss_mask"].astype(bool)
                    r["tokens"], r["sampled"] = len(arrays["token_ids"]), int(mask.sum())
                    v = arrays["versions"][mask]
                    r["v_min"], r["v_max"] = (int(v.min()), int(v.max())) if len(v) else (None,) * 2
        if min_version_span is not None:
            rows = [
                r for r in rows
                if r["v_min"] is not None and r["v_max"] - r["v_min"] >= min_version_span
            ]  # fmt: skip
        return rows[:limit] if limit is not None else rows

    def trajectories(self, episode_id: str, attempt: int | None = None) -> list[Trajectory]:
        """An episode's segments (its latest attempt unless ``attempt`` is given)."""
        if attempt is None:
            attempt = self.next_attempt(episode_id) - 1
        rows = self._query(
            "SELECT * FROM trajectories WHERE episode_id = ? AND attempt = ? ORDER BY segment",
            (episode_id, attempt),
        )
        return [_trajectory(r) for r in rows]

    def all_trajectories(self, *, include_retried: bool = False) -> Iterator[Trajectory]:
        sql = (
            "SELECT t.* FROM trajectories t JOIN episodes e ON e.episode_id = t.episode_id "
            "AND e.attempt = t.attempt"
            + (
                ""
                if include_retried
                else " WHERE e.state IN ('finished','truncated','failed') AND e.origin = 'run'"
            )
            + " ORDER BY t.traj_id"
        )
        for r in self._query(sql):
            yield _trajectory(r)

    # -- groups and training ------------------------------------------------------------

    def complete_group(self, group: Group) -> None:
        """Mark a task's group complete (all its episodes ended): ready to train."""
        with self._tx() as db:
            db.execute(
                "UPDATE tasks SET state = 'complete' WHERE task_id = ? AND state = 'pending'",
                (group.task.task_id,),
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
                    "e.attempt = t.attempt WHERE t.task_id = ? AND e.origin = 'run' AND "
                    "e.state IN ('finished', 'truncated', 'failed')",
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
                (version, time.time(), kind, source, _json(stats or {})),
            )

    def versions(self) -> list[dict[str, Any]]:
        rows = self._query("SELECT * FROM versions ORDER BY version")
        return [{**dict(r), "stats": json.loads(r["stats"])} for r in rows]

    def audit(self) -> dict[str, Any]:
        """Account for every task: finished, failed with a reason, or still resumable.

        Returns counts by state and two lists that must be empty: ``lost`` (a trained
        task with fewer ended episodes than its group, an ended trajectory of a trained
        task the trainer never consumed, a failed episode without a reason) and
        ``trained_twice`` (a task consumed in more than one optimizer step, an episode
        segment consumed more than once). ``ok`` is True when both are empty.
        """
        q = self._query
        tasks = {r["state"]: r["n"] for r in q(
            "SELECT state, COUNT(*) AS n FROM tasks GROUP BY state")}  # fmt: skip
        episodes = {r["state"]: r["n"] for r in q(
            "SELECT state, COUNT(*) AS n FROM episodes WHERE origin = 'run' "
            "GROUP BY state")}  # fmt: skip
        final = "('finished', 'truncated', 'failed')"
        lost = [
            f"task {r['task_id']} was trained with {r['n']} of {r['group_size']} episodes"
            for r in q(
                "SELECT k.task_id, k.group_size, COUNT(DISTINCT e.episode_id) AS n FROM tasks k "
                f"LEFT JOIN episodes e ON e.task_id = k.task_id AND e.origin = 'run' AND "
                f"e.state IN {final} WHERE k.state = 'trained' GROUP BY k.task_id "
                "HAVING n < k.group_size"
            )
        ]
        lost += [
            f"trajectory {r['traj_id']} (episode {r['episode_id']}) of trained task "
            f"{r['task_id']} was never consumed"
            for r in q(
                "SELECT t.traj_id, t.episode_id, t.task_id FROM trajectories t "
                "JOIN tasks k ON k.task_id = t.task_id AND k.state = 'trained' "
                "JOIN episodes e ON e.episode_id = t.episode_id AND e.attempt = t.attempt "
                f"WHERE e.origin = 'run' AND e.state IN {final} "
                "AND t.traj_id NOT IN (SELECT traj_id FROM consumed)"
            )
        ]
        lost += [
            f"episode {r['episode_id']} attempt {r['attempt']} failed without a reason"
            for r in q(
                "SELECT episode_id, attempt FROM episodes WHERE origin = 'run' AND "
                "state = 'failed' AND reason = ''"
            )
        ]
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
        resumable = tasks.get("pending", 0) + tasks.get("complete", 0)
        return {
            "tasks": sum(tasks.values()),
            "tasks_by_state": tasks,
            "episodes_by_state": episodes,
            "trained_tasks": tasks.get("trained", 0),
            "resumable_tasks": resumable,
            "partials": len(q("SELECT episode_id FROM partials")),
            "consumed_steps": self.last_step(),
            "lost": lost,
            "trained_twice": twice,
            "ok": not lost and not twice,
        }

    def stats(self) -> dict[str, Any]:
        """Counts by state and the bytes the token arrays take."""
        tasks = {r["state"]: r["n"] for r in self._query(
            "SELECT state, COUNT(*) AS n FROM tasks GROUP BY state")}  # fmt: skip
        episodes = {r["state"]: r["n"] for r in self._query(
            "SELECT state, COUNT(*) AS n FROM episodes GROUP BY state")}  # fmt: skip
        row = self._query(
            "SELECT COALESCE(SUM(num_tokens), 0) AS tokens, COALESCE(SUM(LENGTH(token_ids) + "
            "LENGTH(logprobs) + LENGTH(versions) + LENGTH(loss_mask)), 0) AS bytes "
            "FROM trajectories"
        )[0]
        return {"tasks": tasks, "episodes": episodes, "tokens": row["tokens"],
                "array_bytes": row["bytes"]}  # fmt: skip


class StoreWriter:
    """Writes to the store off the event loop, batched: one transaction per batch.

    Components submit writes without waiting (``started``, ``partial``, ``episode``,
    ``dropped``, ``group``, ``version``); a background task commits whatever is pending
    every ``interval_s``; :meth:`flush` commits now and returns once it is durable.
    Writes are applied in the order they were submitted, except that a newer
    checkpoint of an episode replaces an older one still pending.

    Use as ``async with StoreWriter(store) as writer:``; leaving flushes.
    """

    def __init__(
        self, store: EpisodeStore, *, interval_s: float = 0.2, metrics: Any = None
    ) -> None:
        self.store = store
        self.interval_s = interval_s
        self.metrics = metrics
        self._ops: list[tuple[str, Any] | None] = []
        self._partial_at: dict[str, int] = {}
        self._flush_lock: asyncio.Lock | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None

    async def __aenter__(self) -> StoreWriter:
        self._flush_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="store-writer")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush()

    @property
    def pending(self) -> int:
        return sum(op is not None for op in self._ops)

    def _submit(self, kind: str, payload: Any) -> None:
        self._ops.append((kind, payload))
        if self._wake is not None:
            self._wake.set()

    def task(self, task: Task, group_size: int) -> None:
        self._submit("task", (task, group_size))

    def started(self, episode_id: str, task: Task, attempt: int, version: int) -> None:
        self._submit("started", (episode_id, task, attempt, version))

    def partial(self, partial: PartialEpisode) -> None:
        at = self._partial_at.get(partial.episode_id)
        if at is not None:  # a newer checkpoint supersedes the pending one, in place
            self._ops[at] = ("partial", partial)
            return
        self._partial_at[partial.episode_id] = len(self._ops)
        self._submit("partial", partial)

    def episode(self, trajectories: Sequence[Trajectory], *, retried: bool = False) -> None:
        self._partial_at.pop(trajectories[0].episode_id, None)
        self._submit("episode", (list(trajectories), retried))

    def dropped(self, episode_id: str, attempt: int, reason: str) -> None:
        self._partial_at.pop(episode_id, None)
        self._submit("dropped", (episode_id, attempt, reason))

    def group(self, group: Group) -> None:
        self._submit("group", group)

    def version(self, version: int, kind: str, source: str, stats: dict[str, Any]) -> None:
        self._submit("version", (version, kind, source, stats))

    async def flush(self) -> None:
        """Commit everything submitted so far; return when it is on disk."""
        lock = self._flush_lock or asyncio.Lock()
        async with lock:
            ops = [op for op in self._ops if op is not None]
            self._ops, self._partial_at = [], {}
            if not ops:
                return
            t0 = time.perf_counter()
            await asyncio.to_thread(self._apply, ops)
            if self.metrics is not None:
                self.metrics.observe("store_batch_write_s", time.perf_counter() - t0)
                self.metrics.count("store_writes", len(ops))

    def _apply(self, ops: list[tuple[str, Any]]) -> None:
        store = self.store
        with store.batch():
            for i, (kind, payload) in enumerate(ops):
                if i == 1:
                    faults.point("store_write")
                if kind == "task":
                    store.add_tasks([payload[0]], payload[1])
                elif kind == "started":
                    store.episode_started(*payload)
                elif kind == "partial":
                    store.save_partials([payload])
                elif kind == "episode":
                    store.save_episode(payload[0], retried=payload[1])
                elif kind == "dropped":
                    store.drop_episode(*payload)
                elif kind == "group":
                    store.complete_group(payload)
                elif kind == "version":
                    store.record_version(*payload)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(self.interval_s)
            await self.flush()


def _task(row: sqlite3.Row) -> Task:
    return Task(
        task_id=row["task_id"],
        env_id=row["env_id"],
        seed=row["seed"],
        options=None if row["options"] is None else json.loads(row["options"]),
        env_kwargs=json.loads(row["env_kwargs"]),
    )


def _trajectory_meta(t: Trajectory) -> dict[str, Any]:
    return {
        "task_id": t.task_id,
        "seed": t.seed,
        "spans": [dataclasses.astuple(s) for s in t.spans],
        "messages": t.messages,
        "turn_rewards": t.turn_rewards,
        "reason": t.reason,
        "timings": t.timings.as_dict(),
        "info": t.info,
        "env_log": t.env_log,
        "turn_starts": t.turn_starts,
    }


def _trajectory(row: sqlite3.Row) -> Trajectory:
    meta = json.loads(row["meta"])
    return Trajectory(
        episode_id=row["episode_id"],
        task_id=row["task_id"],
        env_id=row["env_id"],
        seed=meta["seed"],
        spans=tuple(TokenSpan(*s) for s in meta["spans"]),
        messages=meta["messages"],
        turn_rewards=meta["turn_rewards"],
        reward=row["reward"],
        status=row["status"],
        reason=meta["reason"],
        segment=row["segment"],
        attempt=row["attempt"],
        timings=Timings(**meta["timings"]),
        info=meta["info"],
        env_log=meta.get("env_log", []),
        turn_starts=meta.get("turn_starts", []),
        **{k: _unblob(row[k], d) for k, d in _DTYPES.items()},
    )


def _partial(row: sqlite3.Row) -> PartialEpisode:
    arrays = {k: _unblob(row[k], d) for k, d in _DTYPES.items()}
    meta = json.loads(row["meta"])
    segments = []
    for start, end, spans in meta.pop("segments"):
        segments.append(
            SegmentArrays(
                **{k: v[start:end] for k, v in arrays.items()},
                spans=[TokenSpan(*s) for s in spans],
            )
        )
    meta["task"] = Task(**meta["task"])
    meta["timings"] = Timings(**meta["timings"])
    return PartialEpisode(segments=segments, **meta)


__all__ = ["FINAL_STATES", "SCHEMA_VERSION", "STORE_FILE", "EpisodeStore", "StoreWriter"]
