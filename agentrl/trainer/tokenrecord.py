"""The trainer's per-token record: what it computed for each trajectory it trained on.

For every row of every micro-batch (one trajectory segment), :class:`TokenRecorder`
writes the trainer's logprob of each token, the importance weight it applied, the
token's advantage, and whether an off-policy correction masked the token, to
``RUN_DIR/trainer_tokens.db`` (SQLite, one row per segment and step; float16 arrays,
7 bytes per token), beside the episode store and apart from it, so the store's writer
never waits on it. ``trainer.record_tokens`` (on by default) switches it; under
multi-process training rank 0 records its own share of the rows.

Column ``j`` of a row is the prediction of token ``j + 1`` (the first token has
none): :func:`read_record` returns arrays aligned to the trajectory's tokens, with NaN
(or False) at token 0 and wherever the row was not trained. Takes tensors duck-typed
(``detach().float().cpu().numpy()``), so importing it never imports torch.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import numpy as np

RECORD_FILE = "trainer_tokens.db"
FIELDS = ("trainer_logprob", "importance_weight", "advantage", "masked")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS trained (
    episode_id TEXT NOT NULL, attempt INTEGER NOT NULL, segment INTEGER NOT NULL,
    step INTEGER NOT NULL, tokens INTEGER NOT NULL, trainer_logprob BLOB NOT NULL,
    importance_weight BLOB NOT NULL, advantage BLOB NOT NULL, masked BLOB NOT NULL,
    at REAL NOT NULL, PRIMARY KEY (episode_id, attempt, segment, step)
)
"""


class TokenRecorder:
    """Writes each trained row's per-token values (see the module docstring)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / RECORD_FILE
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = NORMAL")
        self._db.execute(_SCHEMA)

    def add(self, step: int, mb: Any, logprobs: Any, weights: Any, keep: Any) -> None:
        """Record micro-batch ``mb`` of optimizer step ``step``: the trainer's
        ``logprobs``, the importance ``weights`` and the corrections' ``keep`` (all
        ``(rows, columns)``, the padded layout of ``mb``)."""
        if not mb.keys:
            return
        arrays = [_numpy(x) for x in (logprobs, weights, mb.advantages, mb.mask, keep)]
        lp, w, adv, mask, kept = arrays
        lengths = _numpy(mb.attention_mask).sum(-1).astype(int) - 1
        now, rows = time.time(), []
        for r, (episode_id, attempt, segment) in enumerate(mb.keys):
            n = int(lengths[r])
            masked = (mask[r, :n] > 0) & (kept[r, :n] == 0)
            rows.append(
                (
                    episode_id,
                    attempt,
                    segment,
                    step,
                    n,
                    _f16(lp[r, :n]),
                    _f16(w[r, :n]),
                    _f16(adv[r, :n]),
                    masked.astype(np.int8).tobytes(),
                    now,
                )
            )
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT OR REPLACE INTO trained VALUES (?,?,?,?,?,?,?,?,?,?)", rows
            )

    def close(self) -> None:
        self._db.close()


def read_record(run_dir: Path, episode_id: str, attempt: int) -> dict[int, dict[str, list[Any]]]:
    """The newest record of each segment of an attempt, aligned to its tokens (see the
    module docstring); empty when the run has no record or never trained it. Read-only."""
    path = Path(run_dir) / RECORD_FILE
    if not path.is_file():
        return {}
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT segment, tokens, trainer_logprob, importance_weight, advantage, masked "
            "FROM trained WHERE episode_id = ? AND attempt = ? ORDER BY step",
            (episode_id, attempt),
        ).fetchall()
    except sqlite3.OperationalError:  # being created right now: no record yet
        return {}
    finally:
        db.close()
    out: dict[int, dict[str, list[Any]]] = {}
    for segment, _tokens, *blobs in rows:  # ordered by step: the newest step wins
        values = [np.frombuffer(b, dtype="<f2").astype(float) for b in blobs[:3]]
        masked = np.frombuffer(blobs[3], dtype=np.int8).astype(bool)
        record = {
            name: [None] + [None if np.isnan(x) else round(float(x), 4) for x in v]
            for name, v in zip(FIELDS, values, strict=False)
        }
        record["masked"] = [False, *masked.tolist()]
        out[segment] = record
    return out


def _numpy(x: Any) -> np.ndarray:
    return x.detach().float().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def _f16(values: np.ndarray) -> bytes:
    return np.ascontiguousarray(values, dtype="<f2").tobytes()
