"""The run-health rules: small, pure checks over the series of per-step metrics.

Each rule names the metrics it reads (a row of ``metrics.jsonl`` holds them, see
:mod:`agentrl.health.signals` for the ones computed for it) and returns, for the history
so far, a message when something is wrong or None. It keeps no state: firing once per
episode of trouble (and re-arming once the metric has recovered) is
:class:`agentrl.health.watch.HealthWatch`'s. A rule whose metrics are absent (nan, or
never recorded) stays silent: it is inactive on that run.

Vocabulary: the *baseline* is the mean of the first ``health.window`` values, *now* the
mean of the last ``window``. Thresholds are :class:`~agentrl.config.HealthConfig`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol

from agentrl.config import HealthConfig


class History:
    """The metrics the rules read, one value per step (nan where a step lacked it).

    Every query costs the same at step 10 or 10,000: finite values are counted as they
    come, and a baseline, once its ``n`` values exist, is kept.
    """

    def __init__(self, metrics: Sequence[str]) -> None:
        self.columns: dict[str, list[float]] = {m: [] for m in metrics}
        self.steps: list[int] = []
        self._finite = dict.fromkeys(metrics, 0)
        self._baselines: dict[tuple[str, int], float] = {}

    def append(self, step: int, row: Mapping[str, object]) -> None:
        self.steps.append(step)
        for name, column in self.columns.items():
            value = row.get(name)
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            v = float(value) if ok else math.nan  # type: ignore[arg-type]
            column.append(v)
            self._finite[name] += v == v

    def __len__(self) -> int:
        return len(self.steps)

    def last(self, metric: str) -> float:
        column = self.columns[metric]
        return column[-1] if column else math.nan

    def recent(self, metric: str, n: int, skip: int = 0) -> float:
        """Mean of the finite values among the last ``n`` steps (after dropping the
        newest ``skip``); nan if there are none."""
        column = self.columns[metric]
        end = len(column) - skip
        return _mean(column[max(0, end - n) : max(0, end)])

    def baseline(self, metric: str, n: int) -> float:
        """Mean of the first ``n`` finite values (nan while there are fewer)."""
        key = (metric, n)
        if key in self._baselines:
            return self._baselines[key]
        if self._finite[metric] < n:
            return math.nan
        values = [v for v in self.columns[metric] if v == v][:n]
        self._baselines[key] = _mean(values)
        return self._baselines[key]

    def count(self, metric: str) -> int:
        """How many steps had a finite value of ``metric``."""
        return self._finite[metric]


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if v == v]
    return sum(finite) / len(finite) if finite else math.nan


class Rule(Protocol):
    """One health rule: ``check`` returns what is wrong in words, or None."""

    name: str
    metrics: tuple[str, ...]

    def check(self, h: History) -> str | None: ...


def _learning(h: History, rise: float, w: int) -> bool:
    """Whether the mean reward has risen by ``rise`` since the first window: a policy that
    narrows while it learns is converging, not collapsing (a healthy demo does both)."""
    if h.count("reward_mean") < 2 * w:
        return False
    return h.recent("reward_mean", w) - h.baseline("reward_mean", w) >= rise


class EntropyCollapse:
    """Mean sampled-token entropy below a floor, or fallen far below where it started,
    while the reward has not risen (``reward_rise``): collapse without learning."""

    name = "entropy_collapse"
    metrics = ("entropy",)

    def __init__(self, c: HealthConfig) -> None:
        self.floor, self.drop, self.w = c.entropy_floor, c.entropy_drop, c.window
        self.rise = c.reward_rise

    def check(self, h: History) -> str | None:
        if _learning(h, self.rise, self.w):
            return None
        last = h.last("entropy")
        if last < self.floor:
            return f"sampled-token entropy {last:.4f} nats, under the floor {self.floor}"
        if h.count("entropy") < 2 * self.w:
            return None
        base, now = h.baseline("entropy", self.w), h.recent("entropy", self.w)
        if now < self.drop * base:
            return f"sampled-token entropy fell to {now:.3f} nats from {base:.3f} at the start"
        return None


class Accelerating:
    """A metric rising faster than it has been: the last window's rise is ``factor``
    times the rise of the window before, and at least half the level it rose from."""

    def __init__(self, name: str, metric: str, floor: float, c: HealthConfig, what: str) -> None:
        self.name, self.metrics, self.floor = name, (metric,), floor
        self.factor, self.w, self.what = c.accel_factor, c.window, what

    def check(self, h: History) -> str | None:
        (m,) = self.metrics
        if h.count(m) < 3 * self.w:
            return None
        a, b, c = (h.recent(m, self.w, skip=k * self.w) for k in range(3))
        rise, before = a - b, max(b - c, 0.0)
        if a >= self.floor and rise > self.factor * before and rise >= 0.5 * b:
            return (
                f"{self.what} is accelerating: {b:.4f} -> {a:.4f} over the last "
                f"{self.w} steps (rose {before:.4f} the {self.w} before)"
            )
        return None


class ResponseLength:
    """Sampled tokens per episode collapsing below, or blowing up above, the baseline."""

    name = "response_length"
    metrics = ("response_tokens",)

    def __init__(self, c: HealthConfig) -> None:
        self.low, self.high, self.w = c.length_low, c.length_high, c.window

    def check(self, h: History) -> str | None:
        if h.count("response_tokens") < 2 * self.w:
            return None
        base, now = h.baseline("response_tokens", self.w), h.recent("response_tokens", self.w)
        if now < self.low * base:
            return f"responses collapsed to {now:.0f} sampled tokens per episode from {base:.0f}"
        if now > self.high * base:
            return f"responses blew up to {now:.0f} sampled tokens per episode from {base:.0f}"
        return None


class TurnsCollapse:
    """Nearly every episode ends after one assistant turn, where at first most did not."""

    name = "turns_collapse"
    metrics = ("single_turn_share",)

    def __init__(self, c: HealthConfig) -> None:
        self.share, self.w = c.single_turn_share, c.window

    def check(self, h: History) -> str | None:
        m = "single_turn_share"
        if h.count(m) < 2 * self.w:
            return None
        base, now = h.baseline(m, self.w), h.recent(m, self.w)
        if base < 0.5 and now >= self.share:
            return f"{now:.0%} of episodes end after one turn (at the start: {base:.0%})"
        return None


class RewardWithoutSuccess:
    """Mean reward rising while the success rate (the env's ``info["success"]`` when it
    reports one, else reward >= ``eval.success_reward``) does not follow."""

    name = "reward_without_success"
    metrics = ("reward_mean", "env_success_rate", "success_rate")

    def __init__(self, c: HealthConfig) -> None:
        self.rise, self.success_rise, self.w = c.reward_rise, c.success_rise, c.window

    def check(self, h: History) -> str | None:
        if h.count("reward_mean") < 2 * self.w:
            return None
        success = (
            "env_success_rate" if h.count("env_success_rate") >= 2 * self.w else "success_rate"
        )
        reward = h.recent("reward_mean", self.w) - h.baseline("reward_mean", self.w)
        gained = h.recent(success, self.w) - h.baseline(success, self.w)
        if reward >= self.rise and not gained >= self.success_rise:
            return (
                f"mean reward rose by {reward:.3f} while the success rate moved by "
                f"{gained:+.3f}: the reward may be gamed"
            )
        return None


class ZeroVariance:
    """Most groups have equal rewards: their advantages are zero, nothing is learned."""

    name = "zero_variance"
    metrics = ("zero_variance_share",)

    def __init__(self, c: HealthConfig) -> None:
        self.share, self.w = c.zero_variance_share, c.window

    def check(self, h: History) -> str | None:
        if h.count("zero_variance_share") < self.w:
            return None
        now = h.recent("zero_variance_share", self.w)
        if now >= self.share:
            return f"{now:.0%} of groups have one reward for all episodes (no learning signal)"
        return None


class ToolErrors:
    """Tool errors (failed or malformed calls) per tool result spiking."""

    name = "tool_errors"
    metrics = ("tool_error_rate",)

    def __init__(self, c: HealthConfig) -> None:
        self.rate, self.factor, self.w = c.tool_error_rate, c.tool_error_factor, c.window

    def check(self, h: History) -> str | None:
        m = "tool_error_rate"
        if h.count(m) < self.w + 1:
            return None
        now = h.last(m)
        before = sorted(v for v in h.columns[m][-self.w - 1 : -1] if v == v)
        median = before[len(before) // 2] if before else math.nan
        if now >= self.rate and now >= self.factor * median:
            return f"{now:.0%} of tool results are errors (median {median:.0%} before)"
        return None


class Truncation:
    """The share of truncated episodes (turn, token or tool-call limits) rising."""

    name = "truncation"
    metrics = ("truncated_share",)

    def __init__(self, c: HealthConfig) -> None:
        self.share, self.w = c.truncated_share, c.window

    def check(self, h: History) -> str | None:
        m = "truncated_share"
        if h.count(m) < 2 * self.w:
            return None
        base, now = h.baseline(m, self.w), h.recent(m, self.w)
        if now >= self.share and now >= base + 0.1:
            return f"{now:.0%} of episodes are truncated (at the start: {base:.0%})"
        return None


class Staleness:
    """Mean staleness near ``rollout.max_staleness``: generation runs ahead of training.
    Silent at a bound of 1, where sitting at the bound is the designed one-step overlap."""

    name = "staleness"
    metrics = ("staleness_mean",)

    def __init__(self, c: HealthConfig, max_staleness: int | None) -> None:
        self.bound, self.fraction, self.w = max_staleness, c.staleness_fraction, c.window

    def check(self, h: History) -> str | None:
        if not self.bound or self.bound < 2 or h.count("staleness_mean") < self.w:
            return None
        now = h.recent("staleness_mean", self.w)
        if now >= self.fraction * self.bound:
            return (
                f"mean staleness {now:.2f} is near the bound rollout.max_staleness = {self.bound}"
            )
        return None


class ClippedWeights:
    """A growing share of tokens clipped or masked by the importance-weight corrections."""

    name = "clipped_weights"
    metrics = ("clip_fraction", "masked_fraction")

    def __init__(self, c: HealthConfig) -> None:
        self.share, self.w = c.clipped_share, c.window

    def check(self, h: History) -> str | None:
        if h.count("clip_fraction") < 2 * self.w:
            return None
        now = sum(_zero_nan(h.recent(m, self.w)) for m in self.metrics)
        base = sum(_zero_nan(h.baseline(m, self.w)) for m in self.metrics)
        if now >= self.share and now >= 2 * base:
            return f"{now:.1%} of tokens are clipped or masked (at the start: {base:.1%})"
        return None


def _zero_nan(value: float) -> float:
    return 0.0 if value != value else value


class DegenerateText:
    """The same completion across most of a group while the reward has not risen (a
    converged policy answers alike; judged once two windows are in), or turns looping
    on one n-gram."""

    name = "degenerate_text"
    metrics = ("repeated_completion_share", "ngram_repeat_share")

    def __init__(self, c: HealthConfig) -> None:
        self.groups, self.turns = c.repeated_completion_share, c.ngram_repeat_share
        self.rise, self.w = c.reward_rise, c.window

    def check(self, h: History) -> str | None:
        same, loops = h.last("repeated_completion_share"), h.last("ngram_repeat_share")
        knowable = h.count("reward_mean") >= 2 * self.w  # whether the reward is rising
        if same >= self.groups and knowable and not _learning(h, self.rise, self.w):
            return f"in {same:.0%} of groups most episodes wrote the same text"
        if loops >= self.turns:
            return f"{loops:.0%} of assistant turns loop on one repeated n-gram"
        return None


def default_rules(c: HealthConfig, *, max_staleness: int | None = None) -> list[Rule]:
    """Every rule of :data:`agentrl.config.health.HEALTH_RULES`, with ``c``'s thresholds."""
    return [
        EntropyCollapse(c),
        Accelerating("kl_accelerating", "kl", c.kl_floor, c, "KL to the reference"),
        Accelerating(
            "mismatch_accelerating",
            "logprob_gap_fresh",
            c.mismatch_floor,
            c,
            "the trainer-vs-vLLM logprob gap",
        ),
        ResponseLength(c),
        TurnsCollapse(c),
        RewardWithoutSuccess(c),
        ZeroVariance(c),
        ToolErrors(c),
        Truncation(c),
        Staleness(c, max_staleness),
        ClippedWeights(c),
        DegenerateText(c),
    ]
