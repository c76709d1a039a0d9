"""What the config sections share: the closed sets of values (``Literal``) and the checks.

:func:`_at_least` and :func:`_band` raise :class:`~agentrl.errors.ConfigError` naming the
dotted key, the value and what is allowed; ``_frozen`` is the one dataclass shape of a
section. Imported by :mod:`agentrl.config.sections` and :mod:`agentrl.config.training`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from agentrl.errors import ConfigError

LossKind = Literal["grpo", "dapo", "dr_grpo", "cispo", "bnpo", "dppo"]
CorrectionMode = Literal[
    "none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"
]
AdvantageScheme = Literal["episode", "turn_return", "gigpo"]
StepKey = Literal["observation", "prefix"]
UpdatePolicy = Literal["resume", "keep", "drop"]
WorkerLoop = Literal["uvloop", "asyncio"]
TrainerPrecision = Literal["auto", "bf16", "fp32"]
PackedAttention = Literal["auto", "varlen", "rows", "flash_attention_2", "flex_attention"]

_frozen = dataclasses.dataclass(frozen=True, slots=True)


def _at_least(section: str, obj: Any, minimum: float, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not value >= minimum:
            bound = ">= 0" if minimum == 0 else f"at least {minimum}"
            raise ConfigError(f"{section}.{name} = {value!r}; it must be {bound}")


def _band(section: str, obj: Any, name: str) -> None:
    """``{name}_low`` and ``{name}_high``: each unset or > 0, and low <= high."""
    low, high = getattr(obj, f"{name}_low"), getattr(obj, f"{name}_high")
    for suffix, value in (("low", low), ("high", high)):
        if value is not None and not value > 0:
            raise ConfigError(
                f"{section}.{name}_{suffix} = {value!r}; a ratio bound must be > 0 (leave it "
                f"unset for no bound)"
            )
    if low is not None and high is not None and low > high:
        raise ConfigError(
            f"{section}.{name}_low ({low}) must not exceed {section}.{name}_high ({high})"
        )
