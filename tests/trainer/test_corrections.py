"""Off-policy masks (Geo-RS, IcePop, outlier) and the DPPO loss: hand-computed values,
IcePop against TRL's masked IS, and the trainer's wiring (defaults change nothing)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.config import LossConfig, TrainerConfig
from agentrl.errors import ConfigError
from agentrl.trainer.corrections import (
    correction_masks,
    geometric_sequence_mask,
    outlier_sequence_mask,
    token_band_mask,
)
from agentrl.trainer.losses import dppo_terms, importance_weights, policy_loss
from tests.trainer import test_losses_vs_trl
from tests.trainer.test_checkpoint import synthetic_groups
from tests.trainer.test_losses_vs_trl import T, fixed_inputs

trl_trainer = test_losses_vs_trl.trl_trainer  # the TRL GRPOTrainer fixture, shared
log = math.log


def ratios(*rows: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """(old, behaviour) logprobs whose per-token ratio exp(old - behaviour) is ``rows``."""
    behaviour = torch.full((len(rows), len(rows[0])), -1.0)
    old = behaviour + torch.tensor([[log(r) for r in row] for row in rows])
    return old, behaviour


def test_geometric_sequence_mask_by_hand() -> None:
    e = math.exp
    old, behaviour = ratios(
        [e(0.02), e(-0.02), 1.0],  # geo mean 1: kept
        [e(0.03), 1.0, 1.0],  # (0.03 + 0) / 2 -> e^0.015 = 1.0151 > 1.01: dropped
        [e(-0.03), 1.0, e(5.0)],  # last token off the mask: e^-0.015 = 0.985 < 0.99: dropped
        [e(0.009), e(0.009), e(0.009)],  # e^0.009 = 1.009 kept (the product, 1.027, is not)
        [50.0, 50.0, 50.0],  # no masked token: kept
    )
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 1, 1], [0, 0, 0]])
    keep = geometric_sequence_mask(old, behaviour, mask, 0.99, 1.01)
    assert keep.shape == (5, 1)
    assert keep.flatten().tolist() == [1.0, 0.0, 0.0, 1.0, 1.0]
    # one bound alone
    assert geometric_sequence_mask(old, behaviour, mask, None, 1.01).flatten().tolist() == [
        1.0,
        0.0,
        1.0,
        1.0,
        1.0,
    ]
    assert geometric_sequence_mask(old, behaviour, mask, 0.99, None).flatten().tolist() == [
        1.0,
        1.0,
        0.0,
        1.0,
        1.0,
    ]


def test_icepop_token_mask_by_hand() -> None:
    old, behaviour = ratios([0.4, 0.6, 1.0, 1.9, 2.5, 9.0])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    keep = token_band_mask(old, behaviour, mask, 0.5, 2.0)
    assert keep.tolist() == [[0.0, 1.0, 1.0, 1.0, 0.0, 1.0]]  # off the mask: untouched
    # IcePop's M(r) = r * 1[0.5 <= r <= 2] is TRL's (and our) token_mask correction
    weights = importance_weights(old, behaviour, mask.float(), "token_truncate", None, None)
    mis = importance_weights(old, behaviour, mask.float(), "token_mask", 0.5, 2.0)
    on = mask.bool()
    assert torch.allclose((weights * keep)[on], mis[on])


def test_outlier_sequence_mask_by_hand() -> None:
    old, behaviour = ratios(
        [1.0, 1e-5, 1.0],  # one token below 1e-4: dropped
        [1.0, 50.0, 1.0],  # within [1e-4, 100]: kept
        [200.0, 1.0, 1.0],  # one token above 100: dropped
        [1.0, 1e-5, 1.0],  # the bad token is off the mask: kept
    )
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 0, 1]])
    keep = outlier_sequence_mask(old, behaviour, mask, 1e-4, 100.0)
    assert keep.shape == (4, 1)
    assert keep.flatten().tolist() == [0.0, 1.0, 0.0, 1.0]
    assert outlier_sequence_mask(old, behaviour, mask, None, 100.0).flatten().tolist() == [
        1.0,
        1.0,
        0.0,
        1.0,
    ]


def test_correction_masks_combine_and_count() -> None:
    old, behaviour = ratios(
        [1.0, 1.0, 3.0],  # the token mask drops 1 token
        [1e-5, 1.0, 1.0],  # the outlier mask drops the row (3 tokens), the token mask 1
        [1.0, 1.0, 1.0],  # nothing
    )
    mask = torch.ones(3, 3)
    config = LossConfig(token_mask_low=0.5, token_mask_high=2.0, outlier_low=1e-4)
    # the counts stay tensors: nothing is read back to the host (a wait for the device
    # on every micro-batch); the trainer reads them with the step's other statistics
    read_back = torch.Tensor.item, torch.Tensor.__float__, torch.Tensor.tolist
    torch.Tensor.item = torch.Tensor.__float__ = torch.Tensor.tolist = None  # type: ignore[assignment,method-assign]
    try:
        masks = correction_masks(old, behaviour, mask, config)
        off = correction_masks(old, behaviour, mask, LossConfig())
    finally:
        torch.Tensor.item, torch.Tensor.__float__, torch.Tensor.tolist = read_back  # type: ignore[method-assign]
    assert masks.keep.tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    counts = (masks.token, masks.outlier, masks.geo, masks.dropped)
    assert all(isinstance(c, torch.Tensor) and c.dim() == 0 for c in counts)
    assert [float(c) for c in counts] == [2.0, 3.0, 0.0, 4.0]
    # the defaults turn every mask off
    assert torch.equal(off.keep, torch.ones(3, 3)) and float(off.dropped) == 0.0


def test_dppo_terms_by_hand() -> None:
    p = torch.tensor([[0.5, 0.5, 0.1, 0.3, 0.1]])
    mu = torch.tensor([[0.25, 0.4, 0.4, 0.4, 0.4]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0]])
    logprobs = p.log().requires_grad_(True)
    config = LossConfig(
        "dppo", dppo_mask_low=0.2, dppo_mask_high=0.2, dppo_kl=0.1, correction="none"
    )
    per_token, clipped = dppo_terms(logprobs, mu.log(), adv, config)
    kl = [0.1 * log(r) ** 2 for r in (2.0, 1.25, 0.25, 0.75, 0.25)]
    expected = [
        0.0 + kl[0],  # A > 0, p rose 0.25 > 0.2: masked, only the penalty
        -1.25 + kl[1],  # A > 0, rose 0.1: -A * r
        0.0 + kl[2],  # A < 0, fell 0.3 > 0.2: masked
        0.75 + kl[3],  # A < 0, fell 0.1: -A * r = 0.75
        -0.25 + kl[4],  # A > 0 and p fell: only the upper bound applies, kept
    ]
    assert torch.allclose(per_token, torch.tensor([expected]), atol=1e-6)
    assert clipped.tolist() == [[True, False, True, False, False]]
    (grad,) = torch.autograd.grad(per_token.sum(), logprobs)
    # d/dlogp of -A * r is -A * r; of kl * (log r)^2 is 2 * kl * log r
    cases = zip((1, 1, -1, -1, 1), (2.0, 1.25, 0.25, 0.75, 0.25), (1, 0, 1, 0, 0), strict=True)
    want = [(0.0 if masked else -a * r) + 2 * 0.1 * log(r) for a, r, masked in cases]
    assert torch.allclose(grad, torch.tensor([want]), atol=1e-6)
    # policy_loss: the ratio against old_logprobs (the behaviour policy), normalised like dapo
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    loss, stats = policy_loss(logprobs, mu.log(), adv, mask, config)
    assert abs(loss.item() - sum(expected[:4]) / 4) < 1e-6
    assert stats["clipped"].item() == 2.0


def test_new_keys_are_checked_and_named() -> None:
    for kwargs, names in (
        ({"geo_mask_low": 1.02, "geo_mask_high": 1.01}, ["trainer.loss.geo_mask_low", "1.01"]),
        ({"token_mask_low": 0.0}, ["trainer.loss.token_mask_low", "> 0"]),
        ({"outlier_high": -1.0}, ["trainer.loss.outlier_high", "-1.0"]),
        ({"dppo_kl": -0.1}, ["trainer.loss.dppo_kl", ">= 0"]),
        ({"kind": "dppo", "ratio_level": "sequence"}, ["trainer.loss.ratio_level", "dppo"]),
    ):
        with pytest.raises(ConfigError) as info:
            LossConfig(**kwargs)
        for name in names:
            assert name in str(info.value), (name, str(info.value))


CASES = ("grpo", "dapo", "bnpo")


@pytest.mark.parametrize("kind", CASES)
def test_icepop_matches_trl_token_mask(trl_trainer: Any, kind: str) -> None:
    """Our IS weights (untruncated) times the IcePop mask, against TRL's masked IS.

    TRL computes ``vllm_importance_sampling_mode = "token_mask"`` inline in
    ``_generate_and_score_completions`` (grpo_trainer.py, TRL 1.16): ``exp((old -
    sampling) * mask)``, set to 0 outside ``[C_min, C_max]``. The weights are built that
    way here and handed to its ``_compute_loss``, as its own pipeline would.
    """
    trainer = trl_trainer
    trainer.loss_type, trainer.epsilon_low, trainer.epsilon_high = kind, 0.2, 0.2
    trainer.importance_sampling_level, trainer.beta, trainer.args.delta = "token", 0.0, None
    trainer.max_completion_length = T
    trainer.use_vllm = trainer.vllm_importance_sampling_correction = True
    inputs = fixed_inputs(seed=11)
    model = trainer.model
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        current, _, _ = trainer._get_per_token_logps_and_entropies(model, input_ids, attention, T)
    g = torch.Generator().manual_seed(5)
    old = current + 0.3 * torch.randn(current.shape, generator=g)
    behaviour = old + 0.5 * torch.randn(current.shape, generator=g)
    mask = inputs["completion_mask"].float()
    ratio = torch.exp((old - behaviour) * mask)
    inputs["old_per_token_logps"] = old
    inputs["importance_sampling_ratio"] = ratio.masked_fill((ratio < 0.5) | (ratio > 2.0), 0.0)
    theirs = trainer._compute_loss(model, inputs)

    config = LossConfig(
        kind,
        0.2,
        0.2,
        correction="token_truncate",
        correction_min=None,
        correction_max=None,
        token_mask_low=0.5,
        token_mask_high=2.0,
    )
    masks = correction_masks(old, behaviour, mask, config)
    assert 0 < masks.token < mask.sum().item()  # some tokens dropped, not all
    weights = importance_weights(old, behaviour, mask, config.correction, None, None)
    logprobs, _, _ = trainer._get_per_token_logps_and_entropies(model, input_ids, attention, T)
    ours, _ = policy_loss(
        logprobs,
        old,
        inputs["advantages"],
        mask,
        config,
        is_weights=weights * masks.keep,
        num_items=inputs["num_items_in_batch"],
    )
    assert abs(ours.item() - theirs.item()) < 1e-5, (kind, ours.item(), theirs.item())


def trained(tiny_model: Path, **loss: Any) -> Any:
    from agentrl.trainer.trainer import Trainer

    config = TrainerConfig(lr=1e-3, loss=LossConfig(**{"kind": "dapo", **loss}))
    trainer = Trainer(str(tiny_model), config, temperature=1.0, seed=0)
    return trainer.train_step(synthetic_groups(3))


def test_trainer_wiring_masks_and_dppo(tiny_model: Path) -> None:
    base = trained(tiny_model)
    assert base.masked_fraction == 0.0 and base.loss != 0.0
    # bands nothing falls outside: the same step as with every mask off
    wide = trained(tiny_model, token_mask_low=1e-30, token_mask_high=1e30, outlier_high=1e30)
    assert wide.masked_fraction == 0.0 and wide.loss == base.loss
    # a geometric band nothing falls inside (behaviour logprobs are random): all dropped
    none = trained(tiny_model, geo_mask_low=1.0, geo_mask_high=1.0)
    assert none.masked_fraction == 1.0 and none.geo_masked_fraction == 1.0
    assert none.loss == 0.0 and none.grad_norm == 0.0
    # per-turn credit reaches the step: these episodes' turn rewards are not their rewards
    gigpo = trained(tiny_model, advantage="gigpo")
    assert math.isfinite(gigpo.loss) and gigpo.loss != base.loss
    # dppo's ratio is to vLLM's (here random) logprobs: its trust region masks tokens; a
    # ratio to the trainer's own logprobs would be 1 everywhere and mask none
    dppo = trained(tiny_model, kind="dppo")
    assert dppo.loss != 0.0 and math.isfinite(dppo.loss) and dppo.is_weight_mean == 1.0
    assert 0.0 < dppo.clip_fraction < 1.0


@pytest.mark.parametrize(
    ("settings", "fractions"),
    [  # (masked, geo, token, outlier): a bound no ratio reaches drops every token
        ({"token_mask_low": 1e9}, (1.0, 0.0, 1.0, 0.0)),
        ({"outlier_low": 1e9}, (1.0, 0.0, 0.0, 1.0)),
        ({"geo_mask_low": 1e9}, (1.0, 1.0, 0.0, 0.0)),
        ({}, (0.0, 0.0, 0.0, 0.0)),
    ],
)
def test_a_train_step_reports_what_each_mask_dropped(tiny_model, settings, fractions) -> None:
    """The counts travel with the step's other statistics (one read a step) and land in
    their own fields of the step's stats."""
    from tests.trainer.test_gpu_paths import _step

    _trainer, stats, _grads = _step(tiny_model, loss=LossConfig("grpo", **settings))
    assert stats.tokens > 0
    reported = (
        stats.masked_fraction,
        stats.geo_masked_fraction,
        stats.token_masked_fraction,
        stats.outlier_masked_fraction,
    )
    assert reported == pytest.approx(fractions)
