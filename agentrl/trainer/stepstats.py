"""A training step's statistics: what each micro-step adds, and the step's one record.

:class:`StepTally` is the running total of one optimizer step. Each micro-step queues
its figures as one small device tensor (:meth:`StepTally.add`): reading them at once
(``float(t)``) would make the host wait for every micro-step's backward, so that it
could not queue the next one meanwhile. :meth:`StepTally.settle` reads them all in one
transfer when the step ends, and :meth:`StepTally.stats` turns the totals into the
:class:`StepStats` the loop logs. The trainer (:mod:`agentrl.trainer.trainer`) owns the
step; this module owns only its arithmetic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from agentrl.trainer.batch import MicroBatch
from agentrl.trainer.corrections import CorrectionMasks
from agentrl.types import Group


@dataclasses.dataclass(slots=True)
class StepStats:
    """One optimizer step's record: what the training loop logs (``metrics.jsonl``, kind
    ``train``) and the health rules read. Fractions are of the tokens trained."""

    step: int
    version: int
    loss: float
    clip_fraction: float
    is_weight_min: float
    is_weight_mean: float
    is_weight_max: float
    masked_fraction: float
    """Tokens the off-policy masks (Geo-RS, IcePop, outlier) dropped, of those trained."""
    geo_masked_fraction: float
    token_masked_fraction: float
    outlier_masked_fraction: float
    logprob_gap_fresh: float
    """Mean |trainer logprob - vLLM logprob| on tokens sampled by the version trained."""
    fresh_tokens: int
    staleness_min: float
    staleness_mean: float
    staleness_max: float
    tokens: int
    sequences: int
    grad_norm: float
    kl: float
    reward_mean: float
    step_s: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# The order of the figures in each micro-step's queued tensor.
_PENDING = (
    "loss",
    "clipped",
    "tokens",
    "kl",
    "w_min",
    "w_max",
    "w_sum",
    "st_min",
    "st_max",
    "st_sum",
    "gap_sum",
    "gap_n",
    "dropped",
    "geo",
    "token",
    "outlier",
)


@dataclasses.dataclass(slots=True)
class StepTally:
    """The totals of one step over its micro-steps (this rank's)."""

    loss: float = 0.0
    clipped: float = 0.0
    """Tokens whose ratio the loss clipped."""
    tokens: int = 0
    """Tokens trained (mask on)."""
    kl: float = 0.0
    w_min: float = float("inf")
    """Importance weights over the tokens trained: min, max, sum."""
    w_max: float = 0.0
    w_sum: float = 0.0
    st_min: float = float("inf")
    """Token staleness (versions behind) over the tokens trained: min, max, sum."""
    st_max: float = 0.0
    st_sum: float = 0.0
    gap_sum: float = 0.0
    """Sum of |trainer - vLLM logprob| over fresh tokens (sampled by this version)."""
    gap_n: int = 0
    dropped: float = 0.0
    """Tokens the off-policy masks dropped: in all, and per mask."""
    geo: float = 0.0
    token: float = 0.0
    outlier: float = 0.0
    pending: list[torch.Tensor] = dataclasses.field(default_factory=list)

    def add(
        self,
        loss: torch.Tensor,
        stats: dict[str, Any],
        mb: MicroBatch,
        mask: torch.Tensor,
        old: torch.Tensor,
        weights: torch.Tensor,
        masks: CorrectionMasks,
        version: int,
    ) -> None:
        """Queue one micro-step's figures (device tensors; :meth:`settle` reads them)."""
        on = mask.bool()
        inf = torch.tensor(float("inf"), device=on.device)
        w = weights.expand_as(mask)
        staleness = (version - mb.versions).to(torch.float32)
        fresh = on & (mb.versions == version)
        kl = stats.get("kl")
        values = (
            loss.detach(),
            stats["clipped"],
            on.sum(),
            kl if kl is not None else torch.zeros((), device=on.device),
            torch.where(on, w, inf).min(),
            torch.where(on, w, -inf).max(),
            torch.where(on, w, 0.0).sum(),
            torch.where(on, staleness, inf).min(),
            torch.where(on, staleness, -inf).max(),
            torch.where(on, staleness, 0.0).sum(),
            torch.where(fresh, (old - mb.behaviour_logprobs).abs(), 0.0).sum(),
            fresh.sum(),
            masks.dropped,
            masks.geo,
            masks.token,
            masks.outlier,
        )
        self.pending.append(
            torch.stack([torch.as_tensor(v, device=on.device).double() for v in values])
        )

    def settle(self) -> None:
        """Fold the queued micro-step figures into the totals: one read for the step."""
        pending, self.pending = self.pending, []
        if not pending:
            return
        for row in torch.stack(pending).tolist():
            v = dict(zip(_PENDING, row, strict=True))
            self.loss += v["loss"]
            self.clipped += v["clipped"]
            self.tokens += int(v["tokens"])
            self.kl += v["kl"]
            self.dropped += v["dropped"]
            self.geo += v["geo"]
            self.token += v["token"]
            self.outlier += v["outlier"]
            if not v["tokens"]:
                continue
            self.w_min = min(self.w_min, v["w_min"])
            self.w_max = max(self.w_max, v["w_max"])
            self.w_sum += v["w_sum"]
            self.st_min = min(self.st_min, v["st_min"])
            self.st_max = max(self.st_max, v["st_max"])
            self.st_sum += v["st_sum"]
            self.gap_sum += v["gap_sum"]
            self.gap_n += int(v["gap_n"])

    def stats(
        self,
        *,
        step: int,
        version: int,
        groups: Sequence[Group],
        sequences: int,
        micro_batches: int,
        grad_norm: float,
        step_s: float,
    ) -> StepStats:
        """The step's record from the settled totals (fractions of the tokens trained)."""
        n = self.tokens
        rewards = [t.reward for g in groups for t in g.trajectories if t.segment == 0]
        return StepStats(
            step=step,
            version=version,
            loss=self.loss,
            clip_fraction=self.clipped / n if n else 0.0,
            is_weight_min=self.w_min if n else 1.0,
            is_weight_mean=self.w_sum / n if n else 1.0,
            is_weight_max=self.w_max if n else 1.0,
            masked_fraction=self.dropped / n if n else 0.0,
            geo_masked_fraction=self.geo / n if n else 0.0,
            token_masked_fraction=self.token / n if n else 0.0,
            outlier_masked_fraction=self.outlier / n if n else 0.0,
            logprob_gap_fresh=self.gap_sum / self.gap_n if self.gap_n else float("nan"),
            fresh_tokens=self.gap_n,
            staleness_min=self.st_min if n else 0.0,
            staleness_mean=self.st_sum / n if n else 0.0,
            staleness_max=self.st_max,
            tokens=int(n),
            sequences=sequences,
            grad_norm=grad_norm,
            kl=self.kl / max(micro_batches, 1),
            reward_mean=float(sum(rewards) / len(rewards)) if rewards else 0.0,
            step_s=step_s,
        )
