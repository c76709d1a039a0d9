"""Every loss against TRL's own GRPOTrainer on the same fixed inputs (to 1e-5).

A real ``trl.GRPOTrainer`` is built around the tiny model; its ``_compute_loss`` and
our :func:`policy_loss` see the same model, tokens, advantages and old logprobs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.config import LossConfig
from agentrl.trainer.losses import group_advantages, importance_weights, policy_loss

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
B, P, T = 4, 5, 7


@pytest.fixture(scope="module")
def trl_trainer(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("trl")),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=B,
        num_generations=2,
        report_to=[],
        gradient_checkpointing=False,
        max_completion_length=T,
        beta=0.0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["hi"] * B}),
        processing_class=AutoTokenizer.from_pretrained(tiny_model),
    )
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    return trainer


def fixed_inputs(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    completion_mask = (torch.rand(B, T, generator=g) > 0.2).to(torch.int64)
    completion_mask[:, 0] = 1
    return {
        "prompt_ids": torch.randint(7, 500, (B, P), generator=g),
        "prompt_mask": torch.ones(B, P, dtype=torch.int64),
        "completion_ids": torch.randint(7, 500, (B, T), generator=g),
        "completion_mask": completion_mask,
        "advantages": torch.randn(B, generator=g),
        "num_items_in_batch": completion_mask.sum(),
    }


CASES = {
    "grpo": ({"loss_type": "grpo"}, LossConfig("grpo", 0.2, 0.2, correction="none")),
    "dapo": (
        {"loss_type": "dapo", "epsilon_high": 0.28},
        LossConfig("dapo", 0.2, 0.28, correction="none"),
    ),
    "dr_grpo": (
        {"loss_type": "dr_grpo"},
        LossConfig("dr_grpo", 0.2, 0.2, max_completion_length=T, correction="none"),
    ),
    "cispo": (
        {"loss_type": "cispo", "epsilon_high": 5.0},
        LossConfig("cispo", 0.2, 5.0, correction="none"),
    ),
    "bnpo": ({"loss_type": "bnpo"}, LossConfig("bnpo", 0.2, 0.2, correction="none")),
    "gspo": (
        {"loss_type": "grpo", "importance_sampling_level": "sequence"},
        LossConfig("grpo", 0.2, 0.2, ratio_level="sequence", correction="none"),
    ),
    "dapo+delta": (
        {"loss_type": "dapo", "epsilon_high": 0.28, "delta": 1.5},
        LossConfig("dapo", 0.2, 0.28, delta=1.5, correction="none"),
    ),
    "grpo+kl": (
        {"loss_type": "grpo", "beta": 0.05},
        LossConfig("grpo", 0.2, 0.2, beta=0.05, correction="none"),
    ),
    "dapo+tis": (
        {"loss_type": "dapo", "epsilon_high": 0.28, "is": "token_truncate"},
        LossConfig("dapo", 0.2, 0.28, correction="token_truncate", correction_max=2.0),
    ),
    "grpo+mis-seq": (
        {"loss_type": "grpo", "is": "sequence_mask"},
        LossConfig(
            "grpo", 0.2, 0.2, correction="sequence_mask", correction_min=0.5, correction_max=2.0
        ),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_loss_matches_trl(trl_trainer: Any, case: str) -> None:
    settings, config = CASES[case]
    trainer = trl_trainer
    trainer.loss_type = settings["loss_type"]
    trainer.epsilon_low = 0.2
    trainer.epsilon_high = settings.get("epsilon_high", 0.2)
    trainer.importance_sampling_level = settings.get("importance_sampling_level", "token")
    trainer.args.delta = settings.get("delta")
    trainer.beta = settings.get("beta", 0.0)
    trainer.max_completion_length = T
    inputs = fixed_inputs(seed=len(case))
    model = trainer.model
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        current, _, _ = trainer._get_per_token_logps_and_entropies(model, input_ids, attention, T)
    g = torch.Generator().manual_seed(99)
    old = current + 0.3 * torch.randn(current.shape, generator=g)  # ratios away from 1
    behaviour = old + 0.5 * torch.randn(current.shape, generator=g)
    ref = current + 0.2 * torch.randn(current.shape, generator=g)
    inputs["old_per_token_logps"] = old
    if trainer.beta:
        inputs["ref_per_token_logps"] = ref
    mask = inputs["completion_mask"].float()
    weights = None
    trainer.use_vllm = "is" in settings
    trainer.vllm_importance_sampling_correction = "is" in settings
    if "is" in settings:
        weights = importance_weights(
            old, behaviour, mask, config.correction, config.correction_min, config.correction_max
        )
        inputs["importance_sampling_ratio"] = weights
    theirs = trainer._compute_loss(model, inputs)
    logprobs, _, _ = trainer._get_per_token_logps_and_entropies(model, input_ids, attention, T)
    ours, stats = policy_loss(
        logprobs,
        old,
        inputs["advantages"],
        mask,
        config,
        is_weights=weights,
        ref_logprobs=ref if trainer.beta else None,
        num_items=inputs["num_items_in_batch"],
    )
    assert abs(ours.item() - theirs.item()) < 1e-5, (case, ours.item(), theirs.item())
    assert ours.item() != 0.0
    # the gradients agree too
    ours_grad = torch.autograd.grad(ours, list(model.parameters())[-1], retain_graph=False)[0]
    theirs = trainer._compute_loss(model, inputs)
    theirs_grad = torch.autograd.grad(theirs, list(model.parameters())[-1])[0]
    assert torch.allclose(ours_grad, theirs_grad, atol=1e-6)
    assert 0 <= stats["clipped"].item() <= mask.sum().item()


def test_importance_weights_truncate_and_mask() -> None:
    old = torch.tensor([[0.0, -1.0, -2.0]])
    behaviour = torch.tensor([[-1.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0]])
    tis = importance_weights(old, behaviour, mask, "token_truncate", 0.0, 2.0)
    assert torch.allclose(tis, torch.tensor([[2.0, 1.0, torch.exp(torch.tensor(-2.0))]]))
    mis = importance_weights(old, behaviour, mask, "token_mask", 0.5, 2.0)
    assert torch.allclose(mis, torch.tensor([[0.0, 1.0, 0.0]]))
    seq = importance_weights(old, behaviour, mask, "sequence_truncate", 0.0, 10.0)
    assert seq.shape == (1, 1) and torch.allclose(seq, torch.exp(torch.tensor([[-1.0]])))
    assert torch.equal(
        importance_weights(old, behaviour, mask, "none", None, None), torch.ones(1, 3)
    )


def test_group_advantages_like_trl() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0, 0.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    adv = group_advantages(rewards, groups, "group")
    # centred per group, divided by the group's unbiased std (+1e-4), as TRL does
    std = 2**0.5 / 2
    expected = torch.tensor(
        [
            0.5 / (std + 1e-4),
            -0.5 / (std + 1e-4),
            0.0,
            0.0,
            1.0 / (2 * std + 1e-4),
            -1.0 / (2 * std + 1e-4),
        ]
    )
    assert torch.allclose(adv, expected, atol=1e-6)
    assert torch.allclose(
        group_advantages(rewards, groups, "none"), torch.tensor([0.5, -0.5, 0.0, 0.0, 1.0, -1.0])
    )
    batch = group_advantages(rewards, groups, "batch")
    assert torch.allclose(
        batch, torch.tensor([0.5, -0.5, 0.0, 0.0, 1.0, -1.0]) / (rewards.std() + 1e-4)
    )
