"""The GRPO family of policy losses, as pure functions of tensors.

Everything here takes per-token tensors of shape ``(B, T)`` (one row per sequence,
``mask`` marking the sampled tokens the loss covers) and returns a scalar loss plus
statistics; no model, no optimizer, no I/O. The formulas are TRL's
(``GRPOTrainer._compute_loss``, TRL 1.16), and a test builds a real ``GRPOTrainer``
and checks every loss against it on the same inputs.

Three log-probabilities meet here:

* ``logprobs``: the current policy (with gradient);
* ``old_logprobs``: the proximal policy the ratio is taken against (the trainer's own
  logprobs before this optimizer step; detached);
* ``behaviour_logprobs``: what vLLM actually sampled with, per token, possibly several
  versions old. The gap between proximal and behaviour is corrected with importance
  weights (:func:`importance_weights`): truncated (TIS) or masked (MIS), per token or
  per sequence.

Losses (``LossConfig.kind``):

* ``grpo``: clipped ratio, mean over each sequence's tokens, then over sequences;
* ``dapo``: clipped ratio with its own upper epsilon (clip-higher), summed over all
  tokens and divided by the tokens in the whole accumulation window;
* ``dr_grpo``: clipped ratio, summed and divided by ``B * max_completion_length``;
* ``cispo``: the ratio clipped from above and detached, times advantage times logprob,
  normalised like ``dapo``;
* ``bnpo``: clipped ratio, token mean over the micro-batch;
* ``dppo``: prime-rl's default loss (:func:`dppo_terms`): the unclipped ratio to the
  behaviour policy, with tokens outside a trust region on the probability difference
  masked, plus a squared log-ratio penalty; normalised like ``dapo``. Its ratio is taken
  against the behaviour policy (the trainer passes vLLM's logprobs as ``old_logprobs``
  and no importance weights). No TRL counterpart; its test is hand-computed.

``ratio_level = "sequence"`` turns any clipped loss into GSPO (the geometric mean of
the token ratios of each sequence). The masks that drop tokens or sequences too far
off-policy (Geo-RS, IcePop, outliers) are in :mod:`agentrl.trainer.corrections`.
"""

from __future__ import annotations

import typing
from typing import Literal

import torch

from agentrl.config import CorrectionMode, LossConfig, LossKind
from agentrl.errors import ConfigError

LOSSES: tuple[str, ...] = typing.get_args(LossKind)
CORRECTIONS: tuple[str, ...] = typing.get_args(CorrectionMode)


def importance_weights(
    old_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: CorrectionMode,
    low: float | None,
    high: float | None,
) -> torch.Tensor:
    """Weights correcting from the behaviour policy to the proximal one (detached).

    ``token_*``: ``exp(old - behaviour)`` per token; ``sequence_*``: the product over
    the sequence's masked tokens (shape ``(B, 1)``). ``*_truncate`` clamps to
    ``[low, high]`` (TIS); ``*_mask`` zeroes weights outside it (MIS).
    """
    if mode == "none":
        return torch.ones_like(old_logprobs)
    diff = torch.nan_to_num((old_logprobs - behaviour_logprobs) * mask, nan=0.0).detach()
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        if low is None and high is None:  # torch.clamp refuses two missing bounds
            return ratio
        return torch.clamp(ratio, min=low, max=high)
    lo = low if low is not None else -torch.inf
    hi = high if high is not None else torch.inf
    return ratio.masked_fill((ratio < lo) | (ratio > hi), 0.0)


def _ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor, config: LossConfig
) -> torch.Tensor:
    """The importance ratio ``coef_1`` of the current policy over the proximal one.

    Per token, ``exp(logprobs - old_logprobs)``, shape ``(B, T)``; with
    ``ratio_level = "sequence"`` (GSPO), the exponential of the masked mean of the token
    log-ratios, shape ``(B, 1)``.
    """
    log_ratio = logprobs - old_logprobs
    if config.ratio_level == "sequence":
        log_w = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        log_w = log_w.unsqueeze(-1)
    else:
        log_w = log_ratio
    return torch.exp(log_w)


def _per_token_kl(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, coef_1: torch.Tensor, config: LossConfig
) -> torch.Tensor:
    """The k3 estimate of KL to the reference, ``exp(ref - cur) - (ref - cur) - 1``.

    With ``kl_bias_correction``, multiplied by the ratio ``coef_1``.
    """
    per_token_kl = torch.exp(ref_logprobs - logprobs) - (ref_logprobs - logprobs) - 1
    if config.kl_bias_correction:
        per_token_kl = per_token_kl * coef_1
    return per_token_kl


def _surrogate(
    logprobs: torch.Tensor, coef_1: torch.Tensor, advantages: torch.Tensor, config: LossConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The per-token policy loss, which tokens were clipped, and the ratio to report.

    ``cispo``: ``-clamp(coef_1, max=epsilon_high).detach() * A * logprobs``, clipped
    where ``coef_1 > epsilon_high`` and ``A > 0``. Otherwise the PPO objective
    ``-min(coef_1 * A, clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high) * A)``, with
    ``coef_1`` first capped at ``delta`` when given (two-sided clipping); the returned
    ratio is that capped ``coef_1``.
    """
    if config.kind == "cispo":
        clamped = torch.clamp(coef_1, max=config.epsilon_high).detach()
        per_token_loss = -clamped * advantages * logprobs
        clipped = (coef_1 > config.epsilon_high) & (advantages > 0)
        return per_token_loss, clipped, coef_1
    coef_2 = torch.clamp(coef_1, 1 - config.epsilon_low, 1 + config.epsilon_high)
    if config.delta is not None:
        coef_1 = torch.clamp(coef_1, max=config.delta)
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    clipped = ((coef_1 < 1 - config.epsilon_low) & (advantages < 0)) | (
        (coef_1 > 1 + config.epsilon_high) & (advantages > 0)
    )
    return per_token_loss, clipped, coef_1


def dppo_terms(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    config: LossConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DPPO-Binary-TV with a squared log-ratio penalty: per-token loss and masked tokens.

    prime-rl's default loss (``default_loss_fn`` in ``prime_rl/trainer/rl/loss.py``,
    read at commit 559b447): DPPO-Binary-TV ("Rethinking the Trust Region in LLM
    Reinforcement Learning", arXiv 2602.04879) with Kimi K2.5's KL term (arXiv
    2602.02276). prime-rl's ``adv_tau`` (a scale on the advantage) is left out. With
    ``r_t = exp(logprobs_t - behaviour_t)`` and the probability difference
    ``d_t = exp(logprobs_t) - exp(behaviour_t)``::

        masked_t = d_t > dppo_mask_high    if A_t > 0
                   d_t < -dppo_mask_low    otherwise
        loss_t   = -(1 - masked_t) * A_t * r_t + dppo_kl * (log r_t) ** 2

    The trust region is on the change in probability (the binary total variation), so a
    rare token may move far in ratio and a likely one only a little; the mask is
    one-sided, by the sign of the advantage, like PPO's clip. The ratio keeps its
    gradient (no clipping); masked tokens still pay the penalty.

    Returns:
        The per-token loss ``(B, T)`` and where the trust region masked a token whose
        advantage is non-zero (``A > 0`` above it, ``A < 0`` below it).
    """
    log_ratio = logprobs - behaviour_logprobs
    diff = (torch.exp(logprobs) - torch.exp(behaviour_logprobs)).detach()
    above = diff > config.dppo_mask_high
    below = diff < -config.dppo_mask_low
    masked = torch.where(advantages > 0, above, below)
    keep = (~masked).to(logprobs.dtype)
    per_token_loss = -keep * advantages * torch.exp(log_ratio) + config.dppo_kl * log_ratio**2
    clipped = ((advantages > 0) & above) | ((advantages < 0) & below)
    return per_token_loss, clipped


def _aggregate(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
    num_items: float | torch.Tensor | None,
    num_sequences: int | None,
    accumulation_steps: int,
) -> torch.Tensor:
    """Reduce the per-token loss to a scalar, normalised as ``config.kind`` says.

    ``grpo``: masked mean per sequence, then summed over ``num_sequences`` (or averaged
    and divided by ``accumulation_steps``); ``bnpo``: masked sum over ``num_items`` (or
    masked token mean divided by ``accumulation_steps``); ``dr_grpo``: masked sum over
    ``rows * max_completion_length``; ``dapo``, ``cispo``, ``dppo``: masked sum over the
    tokens of the whole window.
    """
    if config.kind == "grpo":
        per_sequence = (per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        if num_sequences is not None:
            return per_sequence.sum() / max(num_sequences, 1)
        return per_sequence.mean() / accumulation_steps
    if config.kind == "bnpo":
        if num_sequences is not None:
            return (per_token_loss * mask).sum() / torch.as_tensor(num_items).clamp(min=1.0)
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0) / accumulation_steps
    if config.kind == "dr_grpo":
        rows = num_sequences if num_sequences is not None else per_token_loss.size(0)
        loss = (per_token_loss * mask).sum() / (rows * config.max_completion_length)
        if num_sequences is None:
            loss = loss / accumulation_steps
        return loss
    # dapo, cispo, dppo: normalised by the tokens of the whole window
    total = mask.sum() * accumulation_steps if num_items is None else num_items
    return (per_token_loss * mask).sum() / torch.as_tensor(total).clamp(min=1.0)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the tokens ``mask`` covers, detached."""
    return ((values * mask).sum() / mask.sum().clamp(min=1.0)).detach()


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
    *,
    is_weights: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    num_items: float | torch.Tensor | None = None,
    num_sequences: int | None = None,
    accumulation_steps: int = 1,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of one micro-batch, scaled for gradient accumulation like TRL.

    Args:
        logprobs: current policy, ``(B, T)``, with gradient.
        old_logprobs: proximal policy, ``(B, T)``; for ``dppo`` the behaviour policy.
        advantages: ``(B,)`` or ``(B, T)``.
        mask: ``(B, T)``, 1 on the tokens the loss covers.
        is_weights: importance weights (``(B, T)`` or ``(B, 1)``) multiplied into the
            per-token loss (see :func:`importance_weights`).
        ref_logprobs: the reference policy, needed when ``config.beta > 0``.
        num_items: tokens in the whole accumulation window (``dapo``, ``cispo``, and
            ``bnpo`` when ``num_sequences`` is given); default: this micro-batch's.
        num_sequences: sequences in the whole window. When given, ``grpo``, ``bnpo``
            and ``dr_grpo`` normalise by window totals instead of per micro-batch
            (TRL's way), so the loss does not depend on how rows were split into
            micro-batches or across processes.
        accumulation_steps: micro-batches per optimizer step (TRL's normalisation).

    Returns:
        The loss and a dict of detached statistics: ``clipped`` (tokens whose ratio
        was clipped, or for ``dppo`` masked by its trust region), ``ratio`` (mean
        ratio), ``kl`` (mean per-token KL, if any).
    """
    mask = mask.to(logprobs.dtype)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    coef_1 = _ratio(logprobs, old_logprobs, mask, config)
    stats: dict[str, torch.Tensor] = {}
    per_token_kl = None
    if config.beta != 0.0:
        if ref_logprobs is None:
            raise ValueError("beta > 0 needs ref_logprobs")
        per_token_kl = _per_token_kl(logprobs, ref_logprobs, coef_1, config)
    if config.kind == "dppo":
        per_token_loss, clipped = dppo_terms(logprobs, old_logprobs, advantages, config)
    else:
        per_token_loss, clipped, coef_1 = _surrogate(logprobs, coef_1, advantages, config)
    if is_weights is not None:
        per_token_loss = per_token_loss * is_weights
    if per_token_kl is not None:
        per_token_loss = per_token_loss + config.beta * per_token_kl
        stats["kl"] = _masked_mean(per_token_kl, mask)
    loss = _aggregate(per_token_loss, mask, config, num_items, num_sequences, accumulation_steps)
    clipped = clipped.expand_as(mask) if clipped.shape != mask.shape else clipped
    stats["clipped"] = (clipped.to(mask.dtype) * mask).sum().detach()
    ratio = coef_1.expand_as(mask) if coef_1.shape != mask.shape else coef_1
    stats["ratio"] = _masked_mean(ratio, mask)
    return loss, stats


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, scale: Literal["group", "batch", "none"]
) -> torch.Tensor:
    """Reward minus its group's mean, divided by the group's (or batch's) std, or not.

    Like TRL's ``scale_rewards``: ``group`` divides by each group's std, ``batch`` by
    the std of all rewards, ``none`` only centres (Dr. GRPO). A std of 0 divides by 1e-4.
    """
    if scale not in ("group", "batch", "none"):
        raise ConfigError(f"trainer.scale_rewards = {scale!r}; use group, batch or none")
    rewards = rewards.to(torch.float64)
    out = torch.empty_like(rewards)
    stds = torch.empty_like(rewards)
    for g in torch.unique(group_ids):
        idx = group_ids == g
        r = rewards[idx]
        out[idx] = r - r.mean()
        stds[idx] = r.std() if r.numel() > 1 else torch.tensor(0.0, dtype=torch.float64)
    if scale == "group":
        out = out / (stds + 1e-4)
    elif scale == "batch":
        std = rewards.std() if rewards.numel() > 1 else torch.tensor(0.0, dtype=torch.float64)
        out = out / (std + 1e-4)
    return out.to(torch.float32)
