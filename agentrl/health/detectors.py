"""Per-episode detectors: what ``agentrl scan`` looks for in each recorded episode.

A detector is a plain function ``(episode, context) -> str | None``: it gets one
:class:`Episode` (an attempt's segments and the other attempts of the same episode) and
the run's :class:`ScanContext`, and returns why the episode looks wrong, or None. Add your
own the same way and pass it to ``agentrl scan RUN --detector my_module:my_detector``
(or to :func:`agentrl.health.scan.scan_store` in ``detectors=``)::

    def long_tool_chains(episode, context):
        calls = sum(m.get("role") == "tool" for m in episode.final.messages)
        return f"{calls} tool results" if calls > 20 else None

:data:`DETECTORS` holds the built-in ones by name.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentrl.health.signals import assistant_turns, loops
from agentrl.types import Trajectory

ANSWER_KEYS = ("answer", "target", "expected_answer", "solution")
"""Keys of an episode's env ``info`` read as "the answer the env checks for"."""


@dataclasses.dataclass(frozen=True, slots=True)
class Attempt:
    """Another attempt of the same episode, in brief."""

    attempt: int
    reward: float
    status: str


@dataclasses.dataclass(frozen=True, slots=True)
class Episode:
    """One recorded attempt of an episode, as a detector sees it."""

    episode_id: str
    attempt: int
    segments: tuple[Trajectory, ...]
    attempts: tuple[Attempt, ...] = ()
    """Every ended attempt of this episode, this one included."""

    @property
    def final(self) -> Trajectory:
        return self.segments[-1]

    @property
    def reward(self) -> float:
        return self.final.reward

    @property
    def sampled_tokens(self) -> int:
        return sum(s.end - s.start for t in self.segments for s in t.spans if s.sampled)

    def tool_results(self) -> list[str]:
        """The text of every tool result in the episode."""
        return [_text(m.get("content")) for m in self.final.messages if m.get("role") == "tool"]


@dataclasses.dataclass(frozen=True, slots=True)
class ScanContext:
    """What detectors know about the whole run."""

    success_reward: float = 1.0
    """``eval.success_reward`` of the run."""
    median_sampled: float = math.nan
    """Median sampled tokens per episode over the scanned episodes."""


Detector = Callable[[Episode, ScanContext], "str | None"]


def repeated_text(episode: Episode, context: ScanContext) -> str | None:
    """An assistant turn that loops on one repeated n-gram."""
    for t in episode.segments:
        for i, turn in enumerate(assistant_turns(t)):
            if loops(turn):
                return f"assistant turn {i + 1} loops on a repeated n-gram ({len(turn)} tokens)"
    return None


def reward_without_success(episode: Episode, context: ScanContext) -> str | None:
    """Rewarded, but the env says it did not succeed (``info["success"]`` false), or it
    earned a success-level reward in an episode that was truncated or failed."""
    t = episode.final
    if t.info.get("success") is False and t.reward > 0:
        return f"reward {t.reward:g} but the env reports success = false"
    if t.status != "finished" and t.reward >= context.success_reward:
        return f"reward {t.reward:g} (a success) in an episode that ended {t.status}"
    return None


def extreme_length(episode: Episode, context: ScanContext) -> str | None:
    """Sampled tokens more than 4x the run's median, or a near-empty reply: fewer than
    max(3, median / 8). A short direct answer (a fifth of the median, say, where the
    usual episode calls a tool first) is a choice of the policy, not an extreme."""
    n, median = episode.sampled_tokens, context.median_sampled
    if not median >= 8:
        return None
    if n > 4 * median:
        return f"{n} sampled tokens, {n / median:.1f}x the run's median ({median:.0f})"
    if n < max(3.0, median / 8):
        return f"{n} sampled tokens, a near-empty reply (the run's median is {median:.0f})"
    return None


def answer_leak(episode: Episode, context: ScanContext) -> str | None:
    """A tool result that contains the answer the env checks for (its ``info`` key
    ``answer``, ``target``, ``expected_answer`` or ``solution``), as a whole word."""
    info = episode.final.info
    answer = next((info[k] for k in ANSWER_KEYS if info.get(k) not in (None, "")), None)
    if answer is None or len(str(answer)) < 2:  # one character is in every text
        return None
    pattern = re.compile(rf"(?<![\w.]){re.escape(str(answer))}(?!\w|\.\d)")
    for i, result in enumerate(episode.tool_results()):
        if pattern.search(result):
            return f"tool result {i + 1} contains the env's answer {str(answer)!r}"
    return None


def reward_jump(episode: Episode, context: ScanContext) -> str | None:
    """Attempts of the same episode (same task and seed) that ended with rewards at least
    half the success reward apart (a failed attempt's missing reward does not count)."""
    ended = [a for a in episode.attempts if a.status in ("finished", "truncated")]
    if len(ended) < 2 or episode.attempt != max(a.attempt for a in ended):
        return None
    low, high = min(a.reward for a in ended), max(a.reward for a in ended)
    if high - low >= 0.5 * context.success_reward:
        rewards = ", ".join(f"{a.attempt}: {a.reward:g}" for a in ended)
        return f"reward jumps between attempts ({rewards})"
    return None


DETECTORS: Mapping[str, Detector] = {
    "repeated_text": repeated_text,
    "reward_without_success": reward_without_success,
    "extreme_length": extreme_length,
    "answer_leak": answer_leak,
    "reward_jump": reward_jump,
}
"""The built-in detectors by name."""


def context_for(episodes: Sequence[Episode], success_reward: float) -> ScanContext:
    lengths = [e.sampled_tokens for e in episodes]
    median = statistics.median(lengths) if lengths else math.nan
    return ScanContext(success_reward=success_reward, median_sampled=float(median))


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return " ".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)
