"""Tasks, groups and unfinished episodes: the units the scheduler, store and trainer share.

A :class:`Task` is an env id plus the seed its group shares; a :class:`Group` is its G
episodes, trained together once all have ended; a :class:`PartialEpisode` is an episode
exactly as far as it got (:class:`SegmentArrays` per segment), enough to continue it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from agentrl.types.trajectory import Trajectory
from agentrl.types.values import (
    NO_VERSION,
    Message,
    Timings,
    TokenSpan,
    _array,
    _quick_pickle,
)


@_quick_pickle
@dataclasses.dataclass(frozen=True, slots=True)
class Task:
    """One unit of work: an env id plus the seed every episode of its group shares."""

    task_id: str
    env_id: str
    seed: int
    options: dict[str, Any] | None = None
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


@_quick_pickle
@dataclasses.dataclass(slots=True)
class Group:
    """The G episodes of one task: trained together once all of them have ended."""

    task: Task
    size: int
    trajectories: list[Trajectory] = dataclasses.field(default_factory=list)
    admitted_at: int | None = None
    """The trainer's version when the scheduler admitted the group (None: restored from
    the store after a restart, or not scheduled): a step at version ``u`` must train
    every group admitted at ``u - max_staleness`` or before."""

    @property
    def episodes(self) -> set[str]:
        return {t.episode_id for t in self.trajectories}

    @property
    def complete(self) -> bool:
        return len(self.episodes) == self.size

    @property
    def rewards(self) -> list[float]:
        """One reward per episode (segments of one episode share it)."""
        seen: dict[str, float] = {}
        for t in self.trajectories:
            seen.setdefault(t.episode_id, t.reward)
        return list(seen.values())

    def min_version(self) -> int:
        versions = [t.min_version() for t in self.trajectories if t.num_sampled]
        return min(versions) if versions else NO_VERSION

    def num_tokens(self) -> int:
        return sum(len(t) for t in self.trajectories)


@_quick_pickle
@dataclasses.dataclass(slots=True)
class SegmentArrays:
    """The token arrays of one segment of an unfinished episode."""

    token_ids: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    loss_mask: np.ndarray
    spans: list[TokenSpan]

    def __post_init__(self) -> None:
        self.token_ids = _array(self.token_ids, np.int32)
        self.logprobs = _array(self.logprobs, np.float32)
        self.versions = _array(self.versions, np.int32)
        self.loss_mask = _array(self.loss_mask, np.int8)


@_quick_pickle
@dataclasses.dataclass(slots=True)
class PartialEpisode:
    """An unfinished episode, exactly as far as it got: enough to continue it.

    Written to the store when a weight update pauses the episode and at turn boundaries
    (its first, then once per ``rollout.checkpoint_interval_s``); read back to resume
    after an update, after a crash, or to debug it.

    Attributes:
        version: the engine's policy version when the snapshot was taken.
        segments: the token arrays so far (the last one is being extended).
        turn: assistant turns completed.
        turn_sampled: tokens of the current, unfinished assistant turn already sampled
            (they end the last segment; 0 at a turn boundary).
        last_finish: how the last completed assistant turn ended.
        env_state: the env's ``get_state()`` when it has one, else None (then resume
            replays ``env_log``'s actions from the seed).
        turn_starts: for each assistant turn, where it started (``messages``,
            ``segment``, ``tokens``, ``env_steps``, ``rewards``, ``tool_calls``): the
            points a fork can branch at.
    """

    episode_id: str
    task: Task
    attempt: int
    version: int
    started_version: int
    segments: list[SegmentArrays]
    messages: list[Message]
    tools: list[dict[str, Any]] | None
    turn: int
    turn_sampled: int
    last_finish: str
    segments_started: int
    rewards: list[float]
    tool_calls: int
    env_state: dict[str, Any] | None
    env_log: list[dict[str, Any]]
    turn_starts: list[dict[str, int]]
    timings: Timings = dataclasses.field(default_factory=Timings)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def concatenated(self) -> dict[str, np.ndarray]:
        """All segments' arrays end to end (segment bounds are in :meth:`meta`)."""
        names = ("token_ids", "logprobs", "versions", "loss_mask")
        return {
            name: np.concatenate([getattr(s, name) for s in self.segments])
            if self.segments
            else np.zeros(0)
            for name in names
        }

    def meta(self) -> dict[str, Any]:
        """Everything but the arrays, as JSON-ready data."""
        bounds, position = [], 0
        for s in self.segments:
            bounds.append((position, position + len(s.token_ids), [x.astuple() for x in s.spans]))
            position += len(s.token_ids)
        return {
            "episode_id": self.episode_id,
            "task": _task_dict(self.task),
            "attempt": self.attempt,
            "version": self.version,
            "started_version": self.started_version,
            "segments": bounds,
            "messages": self.messages,
            "tools": self.tools,
            "turn": self.turn,
            "turn_sampled": self.turn_sampled,
            "last_finish": self.last_finish,
            "segments_started": self.segments_started,
            "rewards": self.rewards,
            "tool_calls": self.tool_calls,
            "env_state": self.env_state,
            "env_log": self.env_log,
            "turn_starts": self.turn_starts,
            "timings": self.timings.as_dict(),
            "info": self.info,
        }

    @property
    def num_sampled(self) -> int:
        return int(sum(int(s.loss_mask.sum()) for s in self.segments))

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments)


_ATOMS = (str, int, float, bool, type(None))


def _task_dict(task: Task) -> dict[str, Any]:
    """``dataclasses.asdict(task)``; the usual task (options and kwargs of plain values)
    without its generic recursion, which every checkpoint paid."""
    parts = (task.options or {}, task.env_kwargs)
    if not all(type(v) in _ATOMS for d in parts for v in d.values()):
        return dataclasses.asdict(task)
    return {
        "task_id": task.task_id,
        "env_id": task.env_id,
        "seed": task.seed,
        "options": None if task.options is None else dict(task.options),
        "env_kwargs": dict(task.env_kwargs),
    }
