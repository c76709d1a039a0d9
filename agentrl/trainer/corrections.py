"""Masks that drop tokens or whole sequences sampled too far from the trainer's policy.

Pure functions of ``(B, T)`` tensors, like :mod:`agentrl.trainer.losses`. All of them
look at the same per-token ratio that :func:`~agentrl.trainer.losses.importance_weights`
corrects, the proximal policy (the trainer's logprobs before this step) over the
behaviour policy (vLLM's logprobs of the sampled token)::

    r_t = exp(old_t - behaviour_t)

and return float 0/1 weights (1: keep). They never look at the current policy, so they
carry no gradient. The trainer multiplies them into the per-token loss (as it does the
importance weights); the normalisers are left alone, so a dropped token still counts in
the denominators, as it does in IcePop's objective and in TRL's masked IS.

* :func:`geometric_sequence_mask` (Geo-RS; SkyRL's ``sequence_mask_metric =
  "geometric"``, verl's ``geo`` rejection sampling): drop a sequence whose geometric-mean
  ratio is outside a band such as ``[0.99, 1.01]``;
* :func:`token_band_mask` (IcePop, Ling team 2025; SkyRL's ``token_mask_is_threshold``):
  drop the tokens whose ratio is outside ``[alpha, beta]``, e.g. ``[0.5, 2.0]``;
* :func:`outlier_sequence_mask` (SkyRL's ``outlier_token_is_threshold``, verl's veto):
  drop a sequence holding any token whose ratio is beyond a hard bound.

:func:`correction_masks` combines the ones a :class:`~agentrl.config.LossConfig` turns on
and counts what each dropped. A sequence is one row: one training segment of an episode.
"""

from __future__ import annotations

import dataclasses

import torch

from agentrl.config import LossConfig


def _log_ratio(old: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``log r_t`` on the tokens ``mask`` covers, 0 elsewhere (NaN behaviour: 0), detached."""
    return torch.nan_to_num((old - behaviour) * mask, nan=0.0).detach()


def _outside(values: torch.Tensor, low: float | None, high: float | None) -> torch.Tensor:
    """Where ``values`` is below ``low`` or above ``high`` (an unset bound never is)."""
    out = torch.zeros_like(values, dtype=torch.bool)
    if low is not None:
        out |= values < low
    if high is not None:
        out |= values > high
    return out


def geometric_sequence_mask(
    old_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    low: float | None,
    high: float | None,
) -> torch.Tensor:
    """Geo-RS: keep a sequence only if its geometric-mean ratio lies in ``[low, high]``.

    ``rho_geo(y) = exp( (1/|y|) * sum_t log r_t )`` over the sequence's masked tokens
    (Liu, Li et al. 2025, "When Speed Kills Stability", part 3; SkyRL recommends
    ``[0.99, 1.01]``). Unlike the product of the ratios, it does not grow with the
    length of the sequence. A sequence with no masked tokens has ``rho_geo = 1``.

    Returns:
        ``(B, 1)`` float weights, 0 for a dropped sequence.
    """
    mask = mask.to(old_logprobs.dtype)
    tokens = mask.sum(-1, keepdim=True).clamp(min=1.0)
    log_sum = _log_ratio(old_logprobs, behaviour_logprobs, mask).sum(-1, keepdim=True)
    geo = torch.exp(log_sum / tokens)
    return (~_outside(geo, low, high)).to(old_logprobs.dtype)


def token_band_mask(
    old_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    low: float | None,
    high: float | None,
) -> torch.Tensor:
    """IcePop: keep a token only if its ratio lies in ``[alpha, beta] = [low, high]``.

    IcePop's objective weights each token by ``M(r_t) = r_t if alpha <= r_t <= beta
    else 0`` (Ling team, "Every Step Evolves", 2025; ``alpha = 0.5, beta = 2`` there).
    This function returns the indicator ``1[alpha <= r_t <= beta]``; with the default
    ``token_truncate`` correction (whose cap is at least ``beta``) the product of the
    two is IcePop's ``M``, and TRL's ``vllm_importance_sampling_mode = "token_mask"``.

    Returns:
        ``(B, T)`` float weights, 0 for a dropped token (and 1 off ``mask``).
    """
    ratio = torch.exp(_log_ratio(old_logprobs, behaviour_logprobs, mask.to(old_logprobs.dtype)))
    return (~_outside(ratio, low, high)).to(old_logprobs.dtype)


def outlier_sequence_mask(
    old_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    low: float | None,
    high: float | None,
) -> torch.Tensor:
    """Drop a sequence holding any masked token with ``r_t < low`` or ``r_t > high``.

    ``keep(y) = prod_t 1[low <= r_t <= high]`` over the sequence's masked tokens
    (SkyRL's outlier token mask, suggested bounds ``1e-4`` and ``100``; verl's veto). One
    catastrophic token (vLLM sampled what the trainer finds nearly impossible) makes the
    whole sequence suspect, not only that token.

    Returns:
        ``(B, 1)`` float weights, 0 for a dropped sequence.
    """
    on = mask.to(torch.bool)
    ratio = torch.exp(_log_ratio(old_logprobs, behaviour_logprobs, mask.to(old_logprobs.dtype)))
    bad = _outside(ratio, low, high) & on
    return (~bad.any(-1, keepdim=True)).to(old_logprobs.dtype)


@dataclasses.dataclass(frozen=True, slots=True)
class CorrectionMasks:
    """The combined keep-weights of the masks that are on, and the tokens each dropped.

    Counts are over the tokens of ``mask``; a token dropped by two masks counts once in
    :attr:`dropped` and once in each mask's own count. They are 0-d tensors on the masks'
    device, not Python floats: reading one (``float(t)``) makes the host wait for the
    device, so the trainer reads them with the step's other statistics, once a step.
    """

    keep: torch.Tensor
    """``(B, T)`` float 0/1 weights (all ones when no mask is on)."""
    dropped: torch.Tensor
    """Tokens of ``mask`` that any mask dropped."""
    geo: torch.Tensor
    """Tokens in sequences the geometric sequence mask dropped."""
    token: torch.Tensor
    """Tokens the IcePop token mask dropped."""
    outlier: torch.Tensor
    """Tokens in sequences the outlier mask dropped."""


def correction_masks(
    old_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
) -> CorrectionMasks:
    """Apply the masks ``config`` turns on (a mask is on when either of its bounds is set)."""
    mask = mask.to(old_logprobs.dtype)
    keep = torch.ones_like(mask)
    none = mask.new_zeros(())
    counts = {"geo": none, "token": none, "outlier": none}
    masks = (
        ("geo", geometric_sequence_mask, config.geo_mask_low, config.geo_mask_high),
        ("token", token_band_mask, config.token_mask_low, config.token_mask_high),
        ("outlier", outlier_sequence_mask, config.outlier_low, config.outlier_high),
    )
    active = [(n, fn, lo, hi) for n, fn, lo, hi in masks if lo is not None or hi is not None]
    for name, fn, low, high in active:
        weights = fn(old_logprobs, behaviour_logprobs, mask, low, high).expand_as(mask)
        counts[name] = ((1.0 - weights) * mask).sum().detach()
        keep = keep * weights
    dropped = ((1.0 - keep) * mask).sum().detach() if active else none
    return CorrectionMasks(keep=keep, dropped=dropped, **counts)
