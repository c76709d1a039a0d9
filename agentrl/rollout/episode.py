"""What one running episode is: its live progress, its state, and how it can end early.

:class:`EpisodeProgress` is the live view progress displays read; :class:`EpisodeState`
is everything a running episode holds (what a checkpoint saves); :class:`EnvFailure`
fails an episode with a :class:`~agentrl.types.FailureKind`; :class:`EpisodeDropped`
is raised when a weight update in ``drop`` mode discards one.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from agentrl.chat import Conversation
from agentrl.config import RolloutConfig
from agentrl.env import EnvHandle
from agentrl.inference.base import SamplingConfig
from agentrl.tools import ToolSet
from agentrl.types import FailureKind, Task, Timings


def sampling(config: RolloutConfig, max_tokens: int) -> SamplingConfig:
    """The sampling parameters of one assistant turn under ``config``."""
    return SamplingConfig(
        max_tokens=max_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        ignore_eos=config.ignore_eos,
    )


@dataclasses.dataclass(slots=True)
class EpisodeProgress:
    """Live state of a running episode, for progress views."""

    episode_id: str
    env_id: str
    turn: int = 0
    phase: str = "env"
    """What it waits on now: engine, tool, env, or paused (held for a weight update)."""
    started_version: int = 0
    sampled: int = 0
    started_at: float = dataclasses.field(default_factory=time.monotonic)
    tokens_by_version: dict[int, int] = dataclasses.field(default_factory=dict)
    """Sampled tokens per policy version, so far."""
    tool_calls: int = 0
    trace: Any = dataclasses.field(default=None, repr=False)
    """An :class:`~agentrl.runtime.tracing.EpisodeTrace` when the runner traces."""

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        if self.trace is not None:
            self.trace.enter(phase)

    def add_tokens(self, versions: Sequence[int]) -> None:
        n = len(versions)
        if not n:
            return
        self.sampled += n
        first = versions[0]
        if versions.count(first) == n:  # one version throughout, the usual turn (in C)
            key = int(first)
            self.tokens_by_version[key] = self.tokens_by_version.get(key, 0) + n
            return
        for v, k in collections.Counter(versions).items():  # a weight update mid-turn
            self.tokens_by_version[int(v)] = self.tokens_by_version.get(int(v), 0) + k


class EnvFailure(Exception):
    """The env raised or misbehaved; the episode fails with this kind and reason.

    Its text (the trajectory's ``reason``) is ``"<kind>: <detail>"``.
    """

    def __init__(self, kind: FailureKind, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


class EpisodeDropped(Exception):
    """A weight update discarded this unfinished episode (``drop`` policy); run it again."""

    def __init__(self, episode_id: str, reason: str, tokens_discarded: int) -> None:
        super().__init__(f"episode {episode_id!r} dropped: {reason}")
        self.reason = reason
        self.tokens_discarded = tokens_discarded


@dataclasses.dataclass(slots=True)
class EpisodeState:
    """Everything one running episode holds; what a checkpoint saves."""

    task: Task
    episode_id: str
    attempt: int
    started_version: int
    progress: EpisodeProgress
    timings: Timings = dataclasses.field(default_factory=Timings)
    rewards: list[float] = dataclasses.field(default_factory=list)
    env_log: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    turn_starts: list[dict[str, int]] = dataclasses.field(default_factory=list)
    tool_calls: int = 0
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    resumed: list[dict[str, int]] = dataclasses.field(default_factory=list)
    """Each resume from a checkpoint (kept in ``info["resumed"]``; ``info`` itself is the
    env's latest): segment, token position, turn, and the version at the checkpoint."""
    handle: EnvHandle | None = None
    toolset: ToolSet | None = None
    conversation: Conversation | None = None
    pending: list[int] = dataclasses.field(default_factory=list)
    """Tokens sampled so far in the current, unfinished assistant turn."""
    drop_reason: str | None = None
    checkpointed_at: float | None = None
    """``time.monotonic()`` at its last per-turn checkpoint (None: none yet)."""
