"""The episode store's on-disk format: schema, connection, codecs and row decoders.

Owns the SQL schema and its version (SQLite's ``user_version``), opening a connection
with the store's pragmas (WAL, ``synchronous=NORMAL``, foreign keys), the encoding of
token arrays (raw little-endian numpy bytes: int32 ids, float32 logprobs, int32
versions, int8 loss mask, 13 bytes per token) and of everything else (JSON), and the
decoding of rows back into :class:`~agentrl.types.Task`,
:class:`~agentrl.types.Trajectory` and :class:`~agentrl.types.PartialEpisode`.
It also names, once, which episodes count: the SQL filters :func:`run_episode` and
:func:`ended_run_episode`. Nothing is pickled, so opening a store never executes code.

It does not read or write rows itself; :class:`~agentrl.store.EpisodeStore` does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
import weakref
from pathlib import Path
from typing import Any, get_args

import numpy as np

from agentrl.errors import StoreError
from agentrl.types import (
    EpisodeStatus,
    PartialEpisode,
    SegmentArrays,
    Task,
    Timings,
    TokenSpan,
    Trajectory,
    dump_json,
    failure_of,
)

SCHEMA_VERSION = 1
STORE_FILE = "episodes.db"

# An episode attempt in one of these states has ended for good: it counts towards its
# group and is trained (the others, running/paused/retried/dropped, are on their way or
# superseded). They are exactly the statuses a trajectory can end with.
FINAL_STATES: tuple[str, ...] = get_args(EpisodeStatus)
RUN_ORIGIN = "run"  # episodes of the run; 'replay' ones were made while debugging

SCHEMA_SQL = """
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
CREATE INDEX IF NOT EXISTS tasks_by_position ON tasks(position);
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

INDEXES_ADDED = "CREATE INDEX IF NOT EXISTS tasks_by_position ON tasks(position)"
"""Indexes created in a store made before they were part of :data:`SCHEMA_SQL`."""

ARRAY_DTYPES = {
    "token_ids": "int32",
    "logprobs": "float32",
    "versions": "int32",
    "loss_mask": "int8",
}


# -- which episodes count ---------------------------------------------------------------


def run_episode(alias: str = "e") -> str:
    """SQL condition: the ``episodes`` row ``alias`` belongs to the run (not a replay)."""
    return f"{alias}.origin = '{RUN_ORIGIN}'"


def ended_run_episode(alias: str = "e") -> str:
    """SQL condition: ``alias`` is a run episode in a final state (one groups count)."""
    states = ", ".join(f"'{s}'" for s in FINAL_STATES)
    return f"{run_episode(alias)} AND {alias}.state IN ({states})"


# -- connection -------------------------------------------------------------------------


def connect(path: Path, *, create: bool = True) -> sqlite3.Connection:
    """Open the SQLite store at ``path``, creating the schema in a new (empty) file if
    ``create``.

    Raises:
        StoreError: the file is not SQLite, not an agentrl store, has a newer schema, or
            is empty and ``create`` is off (it is then left as it was).
    """
    try:
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
        db.execute("PRAGMA busy_timeout = 30000")
        version = db.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.DatabaseError as e:
        raise StoreError(
            f"{str(path)!r} is not a readable SQLite episode store ({e}); if it is "
            f"corrupt, restore it from a backup or start a new run directory"
        ) from e
    try:
        _prepare(db, path, version, create)
    except sqlite3.DatabaseError as e:
        db.close()
        raise StoreError(
            f"{str(path)!r} is not a usable episode store ({e}); if it is corrupt, "
            f"restore it from a backup or start a new run directory"
        ) from e
    except StoreError:
        db.close()
        raise
    return db


def holds_no_store(path: Path) -> bool:
    """Whether ``path`` is an SQLite file with nothing in it (no schema version, no table):
    what a run leaves that stopped while its store was being made. False for anything
    else, unreadable files included (opening those says what is wrong)."""
    try:
        db = sqlite3.connect(path, timeout=30)
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            tables = db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]
        finally:
            db.close()
    except sqlite3.DatabaseError:
        return False
    return version == 0 and tables == 0


def _prepare(db: sqlite3.Connection, path: Path, version: int, create: bool = True) -> None:
    """Check the schema version, set the pragmas, and create the schema in a new file
    (if ``create``)."""
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{str(path)!r} was written by a newer agentrl (store schema {version}; this "
            f"agentrl reads schema {SCHEMA_VERSION} and older); upgrade agentrl to open it"
        )
    # A file without a schema version is refused before any pragma (it stays as it is)
    # unless it is empty and the store is to be made there.
    tables = (
        []
        if version
        else db.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
    )
    names = [t[0] for t in tables][:5]
    if version == 0 and not create:
        what = f"tables {names} but no" if tables else "no tables and no"
        raise StoreError(
            f"{str(path)!r} holds {what} agentrl episode store (left unchanged); give the "
            "run directory of a run that started (its episodes.db), or start the run first"
        )
    if tables:
        raise StoreError(
            f"{str(path)!r} is a SQLite file but not an agentrl episode store "
            f"(it has tables {names}); choose another path"
        )
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute("PRAGMA foreign_keys = ON")
    if version != 0:
        # Added after schema 1 was out (older agentrl reads a store with it as before):
        # without it, every task added scanned the whole tasks table for its position.
        with contextlib.suppress(sqlite3.OperationalError):  # a read-only store: as it is
            db.execute(INDEXES_ADDED)
        return
    with db:
        db.execute("BEGIN")
        db.executescript(SCHEMA_SQL)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


# -- codecs -----------------------------------------------------------------------------


def encode_array(array: np.ndarray, dtype: str) -> bytes:
    """Raw little-endian bytes of ``array`` as ``dtype`` (the same on every machine)."""
    return np.ascontiguousarray(array, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()


def decode_array(data: bytes, dtype: str) -> np.ndarray:
    return np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)


@dataclasses.dataclass(frozen=True)
class PartialRow:
    """A checkpoint already encoded as its ``partials`` row (the arrays as bytes, the rest
    as JSON): what a rollout worker process sends, so the process that writes the store
    only executes the INSERT. :meth:`EpisodeStore.save_partials` takes it as it takes a
    :class:`~agentrl.types.PartialEpisode`."""

    episode_id: str
    attempt: int
    version: int
    columns: tuple[bytes, bytes, bytes, bytes, str]
    """token_ids, logprobs, versions, loss_mask (see ARRAY_DTYPES), then the meta JSON."""

    @classmethod
    def of(cls, p: PartialEpisode) -> PartialRow:
        arrays = p.concatenated()
        columns = (
            *(encode_array(arrays[k], d) for k, d in ARRAY_DTYPES.items()),
            dump_json(p.meta()),
        )
        return cls(p.episode_id, p.attempt, p.version, columns)  # type: ignore[arg-type]

    def decoded(self) -> PartialEpisode:
        """The checkpoint back as a :class:`~agentrl.types.PartialEpisode` (as the store
        reads its row)."""
        row = dict(zip((*ARRAY_DTYPES, "meta"), self.columns, strict=True))
        return partial_from_row(row)  # type: ignore[arg-type]


SegmentColumns = tuple[int, int, int, int, bytes, bytes, bytes, bytes, str]
"""A trajectory's ``trajectories`` row as :meth:`EpisodeStore.save_episodes` writes it,
from ``min_version`` to ``meta``: the oldest and newest sampled versions (-1 when
nothing was sampled), the token and sampled-token counts, the arrays as bytes (see
ARRAY_DTYPES), then the meta JSON."""

_ENCODED: weakref.WeakKeyDictionary[Trajectory, SegmentColumns] = weakref.WeakKeyDictionary()


def segment_columns(t: Trajectory) -> SegmentColumns:
    """``t`` encoded as its ``trajectories`` row (see :data:`SegmentColumns`)."""
    sampled = t.versions[t.loss_mask.astype(bool)]
    lo, hi = (int(sampled.min()), int(sampled.max())) if len(sampled) else (-1, -1)
    arrays = (encode_array(getattr(t, k), d) for k, d in ARRAY_DTYPES.items())
    return (lo, hi, len(t), len(sampled), *arrays, dump_json(trajectory_meta(t)))  # type: ignore[return-value]


def encoded(t: Trajectory, columns: SegmentColumns) -> Trajectory:
    """Remember ``columns`` as ``t``'s row, encoded where it ended (a rollout worker
    process): the store saves ``t`` with them instead of encoding it again, so the one
    process that writes the store only executes the INSERT. Kept while ``t`` lives and
    until it is saved; ``t`` is saved as it was when encoded."""
    _ENCODED[t] = columns
    return t


def columns_of(t: Trajectory) -> SegmentColumns:
    """``t``'s row: as :func:`encoded` remembered it (once), else encoded now."""
    columns = _ENCODED.pop(t, None)
    return segment_columns(t) if columns is None else columns


def trajectory_meta(t: Trajectory) -> dict[str, Any]:
    """Everything of a trajectory the columns and token arrays do not hold."""
    return {
        "task_id": t.task_id,
        "seed": t.seed,
        "spans": [s.astuple() for s in t.spans],
        "messages": t.messages,
        "turn_rewards": t.turn_rewards,
        "reason": t.reason,
        "failure": None if t.failure is None else t.failure.value,
        "timings": t.timings.as_dict(),
        "info": t.info,
        "env_log": t.env_log,
        "turn_starts": t.turn_starts,
    }


# -- row decoders -----------------------------------------------------------------------


def task_from_row(row: sqlite3.Row) -> Task:
    return Task(
        task_id=row["task_id"],
        env_id=row["env_id"],
        seed=row["seed"],
        options=None if row["options"] is None else json.loads(row["options"]),
        env_kwargs=json.loads(row["env_kwargs"]),
    )


def trajectory_from_row(row: sqlite3.Row) -> Trajectory:
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
        failure=failure_of(meta, row["status"]),
        segment=row["segment"],
        attempt=row["attempt"],
        timings=Timings(**meta["timings"]),
        info=meta["info"],
        env_log=meta.get("env_log", []),
        turn_starts=meta.get("turn_starts", []),
        **{k: decode_array(row[k], d) for k, d in ARRAY_DTYPES.items()},
    )


def partial_from_row(row: sqlite3.Row) -> PartialEpisode:
    arrays = {k: decode_array(row[k], d) for k, d in ARRAY_DTYPES.items()}
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
