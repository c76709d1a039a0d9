"""The ``[health]`` section: the run-health rules' switch, thresholds and ``stop_on``.

The rules themselves live in :mod:`agentrl.health` (what each watches and what to do
when it fires: ``docs/guides/health.md``); this module holds only their settings, so the
config tree stays at the ground floor. :data:`HEALTH_RULES` names every rule; the rules
package checks that its rules and this list agree.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal

from agentrl.errors import ConfigError

HealthRule = Literal[
    "entropy_collapse",
    "kl_accelerating",
    "mismatch_accelerating",
    "response_length",
    "turns_collapse",
    "reward_without_success",
    "zero_variance",
    "tool_errors",
    "truncation",
    "staleness",
    "clipped_weights",
    "degenerate_text",
]
HEALTH_RULES: tuple[str, ...] = typing.get_args(HealthRule)


@dataclasses.dataclass(frozen=True, slots=True)
class HealthConfig:
    """``[health]``: warnings while training when learning goes wrong (docs/guides/health.md)."""

    enabled: bool = True
    """Run the health rules after every optimizer step (warnings in the log, the live
    display, `agentrl top` and metrics.jsonl's "health" field)."""
    stop_on: tuple[HealthRule, ...] = ()
    """Rules whose warning stops the run after its step (with a checkpoint; `agentrl train
    --resume RUN` continues it), e.g. ["entropy_collapse", "degenerate_text"]."""
    window: int = 5
    """Steps per window: the baseline is the mean of the first window, "now" the mean of
    the last; trend rules wait for two (accelerating ones for three) windows."""
    rearm_steps: int = 3
    """A rule that fired warns again only after this many steps in a row without trouble."""
    entropy_floor: float = 0.02
    """entropy_collapse: mean sampled-token entropy (nats) below this."""
    entropy_drop: float = 0.25
    """entropy_collapse: or the window's mean entropy below this fraction of the baseline."""
    kl_floor: float = 0.01
    """kl_accelerating: KL to the reference is ignored below this."""
    mismatch_floor: float = 0.02
    """mismatch_accelerating: mean |trainer - vLLM| logprob gap ignored below this."""
    accel_factor: float = 3.0
    """kl_/mismatch_accelerating: the last window's rise is this many times the one before
    (and at least half the level it rose from)."""
    length_low: float = 0.3
    """response_length: sampled tokens per episode below this fraction of the baseline."""
    length_high: float = 3.0
    """response_length: or above this multiple of the baseline."""
    single_turn_share: float = 0.95
    """turns_collapse: share of one-turn episodes at least this, where the baseline had
    under half."""
    reward_rise: float = 0.2
    """reward_without_success: mean reward rose by at least this since the baseline..."""
    success_rise: float = 0.05
    """reward_without_success: ...while the success rate rose by less than this."""
    zero_variance_share: float = 0.9
    """zero_variance: share of groups whose rewards are all equal (no advantage) at least this."""
    tool_error_rate: float = 0.3
    """tool_errors: tool errors (failed or malformed calls) per tool result at least this..."""
    tool_error_factor: float = 3.0
    """tool_errors: ...and this many times the median of the window before."""
    truncated_share: float = 0.3
    """truncation: share of truncated episodes at least this, and 0.1 above the baseline."""
    staleness_fraction: float = 0.9
    """staleness: the window's mean staleness at least this fraction of
    rollout.max_staleness."""
    clipped_share: float = 0.2
    """clipped_weights: share of tokens clipped or masked by the importance weights at
    least this, and twice the baseline."""
    repeated_completion_share: float = 0.5
    """degenerate_text: share of groups where most episodes wrote the same text, at least this."""
    ngram_repeat_share: float = 0.2
    """degenerate_text: or share of assistant turns that loop on one 4-token n-gram."""

    def __post_init__(self) -> None:
        for name in ("window", "rearm_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"health.{name} = {getattr(self, name)!r}; it must be >= 1")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not value >= 0:
                raise ConfigError(f"health.{f.name} = {value!r}; it must be >= 0")
