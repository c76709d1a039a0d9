"""The runs a viewer shows: finding run directories under a root and summing each up.

A run directory is one holding an episode store (``episodes.db``). Its summary comes
from the store (opened read-only: ``EpisodeStore.open(path, create=False)``), from
``status.json`` (written by ``agentrl train``) and from ``metrics.jsonl``; nothing here
writes to a run directory.

Status: ``running`` (status.json names a live process in a running state), ``ended``
(it finished, or a rollout run with no unfinished episode), ``crashed-resumable`` (its
process is gone while work is unfinished: ``agentrl train --resume`` continues it).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError, StoreError
from agentrl.monitor import pid_alive, read_metrics, read_status
from agentrl.store import STORE_FILE, EpisodeStore, browse

ENDED_STATES = ("finished", "failed", "interrupted")
MAX_DEPTH = 4
"""How deep under a root run directories are looked for."""


def find_runs(root: Path) -> dict[str, Path]:
    """Run directories at or under ``root``, by their path relative to it ('.' for root)."""
    root = root.resolve()
    if not root.is_dir():
        raise ConfigError(
            f"{str(root)!r} is not a directory; give a run directory or a folder "
            "of run directories (e.g. runs/)"
        )
    found: dict[str, Path] = {}
    frontier = [root]
    for _ in range(MAX_DEPTH + 1):
        deeper = []
        for folder in frontier:
            if (folder / STORE_FILE).is_file():
                found[str(folder.relative_to(root))] = folder
                continue
            try:
                deeper.extend(
                    sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
                )
            except OSError:
                continue
        frontier = deeper
    return found


def open_store(run_dir: Path) -> EpisodeStore:
    """The run's store, opened read-only (never created, never written)."""
    return EpisodeStore.open(run_dir, create=False)


def run_status(run_dir: Path, unfinished: int) -> str:
    """``running``, ``ended`` or ``crashed-resumable`` (see the module docstring)."""
    status = read_status(run_dir)
    if status is not None:
        if status.get("state") == "finished":
            return "ended"
        if status.get("state") not in ENDED_STATES and pid_alive(status.get("pid")):
            return "running"
        return "crashed-resumable"
    return "crashed-resumable" if unfinished else "ended"


def summary(run_id: str, run_dir: Path) -> dict[str, Any]:
    """One row of the runs list."""
    row: dict[str, Any] = {"id": run_id, "path": str(run_dir), "name": run_dir.name}
    try:
        with open_store(run_dir) as store:
            runs = store.runs()
            counts = browse.counts(store)
    except StoreError as e:
        return {**row, "kind": "?", "status": "unreadable", "error": str(e)}
    by_state = counts["episodes"]
    unfinished = by_state.get("running", 0) + by_state.get("paused", 0)
    train = read_metrics(run_dir)
    last = train[-1] if train else {}
    status = read_status(run_dir) or {}
    started = runs[0]["started_at"] if runs else None
    wall = (status.get("time") or {}).get("wall_s") or last.get("wall_s")
    return {
        **row,
        "kind": runs[-1]["kind"] if runs else "?",
        "status": run_status(run_dir, unfinished),
        "starts": len(runs),
        "started_at": started,
        "steps": counts["last_step"] + 1,
        "steps_planned": status.get("steps"),
        "success": _finite(last.get("success_rate")),
        "reward": _finite(last.get("reward_mean")),
        "wall_s": _finite(wall),
        "episodes": sum(by_state.values()),
        "by_state": by_state,
    }


def detail(run_id: str, run_dir: Path) -> dict[str, Any]:
    """The run page: its summary, config, metrics rows, versions and step cohorts."""
    with open_store(run_dir) as store:
        config = store.first_config()
        versions = store.versions()
        cohorts = browse.cohorts(store)
    metrics = [
        {k: _finite(v) if isinstance(v, float) else v for k, v in row.items()}
        for row in read_metrics(run_dir, kind=None)
    ]
    return {
        "summary": summary(run_id, run_dir),
        "config": config,
        "config_toml": _read(run_dir / "config.toml"),
        "metrics": metrics,
        "versions": [
            {
                "version": v["version"],
                "kind": v["kind"],
                "source": v["source"],
                "published_at": v["published_at"],
            }
            for v in versions
        ],
        "cohorts": cohorts,
    }


def live(run_dir: Path) -> dict[str, Any]:
    """What ``agentrl top`` shows: the status headline and every in-flight episode."""
    status = read_status(run_dir) or {}
    alive = pid_alive(status.get("pid"))
    return {
        "state": status.get("state"),
        "alive": alive,
        "updated_at": status.get("updated_at"),
        "step": status.get("step"),
        "steps": status.get("steps"),
        "version": status.get("version"),
        "reward_mean": _finite(status.get("reward_mean")),
        "in_flight": status.get("in_flight", 0),
        "episodes": status.get("episodes", []) if alive else [],
    }


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None
