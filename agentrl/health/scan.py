"""``agentrl scan RUN``: the health rules over a run's metrics, detectors over its episodes.

Reads, never writes: ``metrics.jsonl`` (replayed through
:class:`~agentrl.health.watch.HealthWatch` with the run's ``[health]`` settings), the
recorded ``config.toml`` (defaults when the run has none, as ``agentrl rollout`` runs),
and the episode store, opened without creating anything. Every ended attempt
(retried ones included) goes through each detector; a flagged one is listed with its
reasons and the ``agentrl replay`` command that shows it.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agentrl.config import RunConfig
from agentrl.errors import ConfigError
from agentrl.health.detectors import DETECTORS, Attempt, Detector, Episode, context_for
from agentrl.health.watch import HealthWarning, replay_rows
from agentrl.monitor import read_metrics
from agentrl.store import EpisodeStore
from agentrl.types import Trajectory


@dataclasses.dataclass(frozen=True, slots=True)
class Flagged:
    """One episode attempt some detectors flagged."""

    episode_id: str
    attempt: int
    reward: float
    status: str
    reasons: tuple[tuple[str, str], ...]
    """(detector, why) pairs."""

    def replay_command(self, run_dir: Path | str) -> str:
        return f"agentrl replay {run_dir} {self.episode_id} --attempt {self.attempt}"

    def as_dict(self, run_dir: Path | str) -> dict[str, Any]:
        return {
            "episode": self.episode_id,
            "attempt": self.attempt,
            "reward": self.reward,
            "status": self.status,
            "reasons": [list(r) for r in self.reasons],
            "replay": self.replay_command(run_dir),
        }


@dataclasses.dataclass(frozen=True, slots=True)
class ScanReport:
    run_dir: Path
    warnings: list[HealthWarning]
    flagged: list[Flagged]
    episodes: int
    """Episode attempts scanned."""
    steps: int
    """Step rows of metrics.jsonl replayed."""


def load_detector(spec: str) -> Detector:
    """``module:function`` (a module on the path or a ``.py`` file) as a detector."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--detector {spec!r} must look like module:function")
    try:
        if module_name.endswith(".py"):
            spec_ = importlib.util.spec_from_file_location(Path(module_name).stem, module_name)
            if spec_ is None or spec_.loader is None:
                raise ImportError(f"cannot load {module_name}")
            module = importlib.util.module_from_spec(spec_)
            spec_.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except (ImportError, OSError) as e:
        raise ConfigError(f"--detector {spec!r}: cannot import {module_name!r} ({e})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"--detector {spec!r}: {module_name} has no function {attr!r}")
    return fn  # type: ignore[no-any-return]


def recorded_config(run_dir: Path) -> RunConfig:
    """The run's recorded config (``config.toml``); the defaults when it has none."""
    path = run_dir / "config.toml"
    return RunConfig.load(path) if path.is_file() else RunConfig()


def episodes_in(store: EpisodeStore) -> list[Episode]:
    """Every ended attempt in the store, each with its episode's other attempts."""
    segments: dict[tuple[str, int], list[Trajectory]] = {}
    for t in store.all_trajectories(include_retried=True):
        segments.setdefault((t.episode_id, t.attempt), []).append(t)
    attempts: dict[str, list[Attempt]] = {}
    for (episode_id, attempt), segs in segments.items():
        segs.sort(key=lambda t: t.segment)
        attempts.setdefault(episode_id, []).append(
            Attempt(attempt, segs[-1].reward, segs[-1].status)
        )
    return [
        Episode(eid, attempt, tuple(segs), tuple(sorted(attempts[eid], key=lambda a: a.attempt)))
        for (eid, attempt), segs in segments.items()
    ]


def detect(
    episodes: list[Episode], detectors: Mapping[str, Detector], success_reward: float
) -> list[Flagged]:
    """Run every detector over every episode; the flagged ones, in store order."""
    context = context_for(episodes, success_reward)
    flagged = []
    for e in episodes:
        reasons = tuple(
            (name, why) for name, fn in detectors.items() if (why := fn(e, context)) is not None
        )
        if reasons:
            flagged.append(Flagged(e.episode_id, e.attempt, e.reward, e.final.status, reasons))
    return flagged


def scan_run(
    run_dir: Path | str,
    *,
    detectors: Mapping[str, Detector] | None = None,
    extra: Iterable[Detector] = (),
) -> ScanReport:
    """Scan a run directory (finished or still running): rules and detectors.

    Args:
        run_dir: holds ``episodes.db`` (and ``metrics.jsonl``, ``config.toml`` when
            ``agentrl train`` made it).
        detectors: the detectors to run by name (default: :data:`DETECTORS`).
        extra: more detectors (``--detector module:function``), named by their function.
    """
    run_dir = Path(run_dir)
    config = recorded_config(run_dir)
    rows = read_metrics(run_dir)
    health = dataclasses.replace(config.health, enabled=True)
    warnings = replay_rows(rows, health, max_staleness=config.rollout.max_staleness)
    chosen = dict(DETECTORS if detectors is None else detectors)
    chosen.update({getattr(fn, "__name__", repr(fn)): fn for fn in extra})
    with EpisodeStore.open(run_dir, create=False) as store:
        episodes = episodes_in(store)
    flagged = detect(episodes, chosen, config.eval.success_reward)
    return ScanReport(run_dir, warnings, flagged, len(episodes), len(rows))
