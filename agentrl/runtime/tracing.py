"""A timeline of the run in Chrome's trace-event format (open it in Perfetto).

    https://ui.perfetto.dev  ->  Open trace file  ->  RUN_DIR/trace.json

Three tracks: *rollout* (one lane per concurrently running episode, with a span for
each phase: engine, tool, env, paused), *trainer* (training steps, weight sync,
checkpoints) and *eval*. Generation and training overlap in time exactly where async
RL gains over sync.

Events are appended to the file as they happen, in batches, without a closing
bracket until :meth:`Tracer.close`; the format allows a missing ``]``, so the trace of
a killed run still opens.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

ROLLOUT, TRAINER, EVAL = 1, 2, 3
_PROCESS_NAMES = {ROLLOUT: "rollout", TRAINER: "trainer", EVAL: "eval"}
TRAIN_LANE, SYNC_LANE, CHECKPOINT_LANE = 1, 2, 3


class Tracer:
    """Writes complete ("X") events; thread-safe; a disabled tracer does nothing."""

    def __init__(self, path: str | Path | None, *, flush_every: int = 2000) -> None:
        self.enabled = path is not None
        self.path = Path(path) if path is not None else None
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()
        self._buffer: list[str] = []
        self._flush_every = flush_every
        self._file: TextIO | None = None
        self._lanes: dict[int, list[int]] = {}
        self._next_lane: dict[int, int] = {}
        self._named: set[tuple[int, int]] = set()
        self.events = 0
        if self.path is not None:
            append = self.path.exists() and self.path.stat().st_size > 0
            self._file = self.path.open("a", encoding="utf-8")
            if not append:
                self._file.write("[\n")
            for pid, name in _PROCESS_NAMES.items():
                self._meta("process_name", pid, 0, name)
            self._meta("thread_name", TRAINER, TRAIN_LANE, "train step")
            self._meta("thread_name", TRAINER, SYNC_LANE, "weight sync")
            self._meta("thread_name", TRAINER, CHECKPOINT_LANE, "checkpoint")

    def now(self) -> float:
        return time.perf_counter()

    # ---- lanes: a free lane per concurrent item, lowest first ---------------------
    def take_lane(self, pid: int) -> int:
        with self._lock:
            free = self._lanes.setdefault(pid, [])
            if free:
                return heapq.heappop(free)
            lane = self._next_lane.get(pid, 0) + 1
            self._next_lane[pid] = lane
        if (pid, lane) not in self._named:
            self._named.add((pid, lane))
            self._meta("thread_name", pid, lane, f"episode slot {lane}")
        return lane

    def release_lane(self, pid: int, lane: int) -> None:
        with self._lock:
            heapq.heappush(self._lanes.setdefault(pid, []), lane)

    # ---- events ----------------------------------------------------------------------
    def span(
        self,
        name: str,
        pid: int,
        tid: int,
        start: float,
        end: float,
        args: dict[str, Any] | None = None,
        cat: str = "",
    ) -> None:
        """A span from ``start`` to ``end`` (``time.perf_counter()`` seconds)."""
        if not self.enabled:
            return
        event = {
            "name": name,
            "cat": cat or name,
            "ph": "X",
            "pid": pid,
            "tid": tid,
            "ts": round((start - self._t0) * 1e6, 1),
            "dur": round(max(0.0, end - start) * 1e6, 1),
        }
        if args:
            event["args"] = args
        self._write(json.dumps(event, default=str))

    @contextlib.contextmanager
    def section(self, name: str, pid: int, tid: int, **args: Any) -> Iterator[dict[str, Any]]:
        """Time the block as one span; the yielded dict adds args."""
        start = time.perf_counter()
        extra: dict[str, Any] = dict(args)
        try:
            yield extra
        finally:
            self.span(name, pid, tid, start, time.perf_counter(), extra)

    def counter(self, name: str, values: dict[str, float]) -> None:
        if not self.enabled:
            return
        ts = round((time.perf_counter() - self._t0) * 1e6, 1)
        self._write(json.dumps({"name": name, "ph": "C", "pid": ROLLOUT, "ts": ts, "args": values}))

    def _meta(self, kind: str, pid: int, tid: int, name: str) -> None:
        if self.enabled:
            self._write(
                json.dumps(
                    {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
                )
            )

    def _write(self, line: str) -> None:
        with self._lock:
            self._buffer.append(line)
            self.events += 1
            if len(self._buffer) >= self._flush_every:
                self._flush_locked()

    def _flush_locked(self) -> None:
        if self._file is not None and self._buffer:
            self._file.write("".join(f"{line},\n" for line in self._buffer))
            self._file.flush()
        self._buffer.clear()

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def close(self) -> None:
        """Flush and close the JSON array (a closed trace is strict JSON)."""
        with self._lock:
            if self._file is None:
                return
            self._flush_locked()
            ts = round((time.perf_counter() - self._t0) * 1e6, 1)
            end = {"name": "end", "ph": "i", "pid": TRAINER, "tid": 0, "s": "g", "ts": ts}
            self._file.write(json.dumps(end) + "\n]\n")
            self._file.close()
            self._file = None


class EpisodeTrace:
    """Phase spans of one episode on its own lane (engine, tool, env, paused)."""

    def __init__(self, tracer: Tracer, episode_id: str, pid: int = ROLLOUT) -> None:
        self.tracer = tracer
        self.episode_id = episode_id
        self.pid = pid
        self.lane = tracer.take_lane(pid) if tracer.enabled else 0
        self.phase: str | None = None
        self.since = time.perf_counter()

    def enter(self, phase: str) -> None:
        now = time.perf_counter()
        if self.phase is not None and self.phase != phase:
            self.tracer.span(
                self.phase,
                self.pid,
                self.lane,
                self.since,
                now,
                {"episode": self.episode_id},
                cat="episode",
            )
        if self.phase != phase:
            self.phase, self.since = phase, now

    def end(self) -> None:
        if self.phase is not None:
            self.enter("")
        if self.tracer.enabled:
            self.tracer.release_lane(self.pid, self.lane)
