"""The training sections: ``[trainer]`` (with ``[trainer.loss]`` and ``[trainer.lora]``)
and ``[train]``.

The trainer takes :class:`TrainerConfig`, the training loop :class:`TrainConfig`; the
line under each field is its documentation (``agentrl config --defaults``). All are
importable from :mod:`agentrl.config` and :mod:`agentrl.config.sections` too.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal

from agentrl.config.fields import (
    AdvantageScheme,
    CorrectionMode,
    LossKind,
    PackedAttention,
    StepKey,
    TrainerPrecision,
    _at_least,
    _band,
    _frozen,
)
from agentrl.errors import ConfigError


@_frozen
class LossConfig:
    """``[trainer.loss]``: the policy-gradient objective (see agentrl.trainer.losses)."""

    kind: LossKind = "dapo"
    """grpo, dapo (token-level, clip-higher), dr_grpo, cispo, bnpo or dppo (prime-rl's)."""
    epsilon_low: float = 0.2
    """The lower clip of the importance ratio."""
    epsilon_high: float = 0.28
    """The upper clip (DAPO's clip-higher); for cispo the cap of the ratio."""
    delta: float | None = None
    """Two-sided clipping: cap the unclipped ratio at delta too (unset: off)."""
    ratio_level: Literal["token", "sequence"] = "token"
    """sequence: GSPO's sequence-level ratio."""
    beta: float = 0.0
    """KL coefficient against the reference policy (0: no KL, no reference pass)."""
    kl_bias_correction: bool = True
    """Multiply the KL estimate by the importance ratio (TRL's default)."""
    max_completion_length: int = 512
    """dr_grpo's constant normaliser (tokens per sequence)."""
    correction: CorrectionMode = "token_truncate"
    """Importance correction against the behaviour policy (vLLM's logprobs); not applied by
    dppo, whose ratio is already taken against it."""
    correction_min: float | None = 0.0
    """Lower bound of the correction weight (unset: none)."""
    correction_max: float | None = 2.0
    """Upper bound of the correction weight (unset: none)."""
    max_token_staleness: int | None = None
    """Mask tokens sampled more than this many versions ago (unset: keep all)."""
    geo_mask_low: float | None = None
    """Geo-RS: drop a sequence whose geometric-mean ratio is below this, e.g. 0.99 (unset: off)."""
    geo_mask_high: float | None = None
    """Geo-RS: drop a sequence whose geometric-mean ratio is above this, e.g. 1.01 (unset: off)."""
    token_mask_low: float | None = None
    """IcePop: drop the tokens whose trainer/vLLM ratio is below this, e.g. 0.5 (unset: off)."""
    token_mask_high: float | None = None
    """IcePop: drop the tokens whose trainer/vLLM ratio is above this, e.g. 2.0 (unset: off)."""
    outlier_low: float | None = None
    """Drop a sequence holding any token whose ratio is below this, e.g. 1e-4 (unset: off)."""
    outlier_high: float | None = None
    """Drop a sequence holding any token whose ratio is above this, e.g. 100 (unset: off)."""
    dppo_mask_low: float = 0.2
    """dppo: mask a token with A < 0 whose probability fell more than this below vLLM's."""
    dppo_mask_high: float = 0.2
    """dppo: mask a token with A > 0 whose probability rose more than this above vLLM's."""
    dppo_kl: float = 1e-3
    """dppo: coefficient of the squared log-ratio (trainer/vLLM) penalty on every token."""
    advantage: AdvantageScheme = "episode"
    """Credit: episode (one advantage per episode), turn_return or gigpo (per assistant turn)."""
    gamma: float = 0.95
    """turn_return and gigpo: discount of later turns' rewards in a turn's return."""
    step_weight: float = 1.0
    """gigpo: weight of the step-level advantage added to the episode-level one."""
    step_key: StepKey = "observation"
    """gigpo: turns form a step group when they saw the same observation, or the same prefix."""

    def __post_init__(self) -> None:
        if not (0 <= self.epsilon_low < 1 and self.epsilon_high >= 0):
            raise ConfigError(
                f"trainer.loss.epsilon_low ({self.epsilon_low}) must be in [0, 1) and "
                f"trainer.loss.epsilon_high ({self.epsilon_high}) >= 0"
            )
        if self.beta < 0:
            raise ConfigError(f"trainer.loss.beta = {self.beta!r}; it must be >= 0")
        if self.max_token_staleness is not None and self.max_token_staleness < 0:
            raise ConfigError(
                f"trainer.loss.max_token_staleness = {self.max_token_staleness!r}; it must be "
                f">= 0 (leave it unset to keep every token)"
            )
        for name in ("geo_mask", "token_mask", "outlier"):
            _band("trainer.loss", self, name)
        _at_least(
            "trainer.loss", self, 0, "dppo_mask_low", "dppo_mask_high", "dppo_kl", "step_weight"
        )
        if self.kind == "dppo" and self.ratio_level != "token":
            raise ConfigError(
                f"trainer.loss.ratio_level = {self.ratio_level!r} with kind 'dppo'; dppo's "
                f"trust region is per token, use ratio_level = 'token'"
            )
        if not 0 <= self.gamma <= 1:
            raise ConfigError(f"trainer.loss.gamma = {self.gamma!r}; use a value in [0, 1]")
        for name, allowed in (("advantage", AdvantageScheme), ("step_key", StepKey)):
            if getattr(self, name) not in typing.get_args(allowed):
                raise ConfigError(
                    f"trainer.loss.{name} = {getattr(self, name)!r} is not allowed; use one of: "
                    f"{', '.join(typing.get_args(allowed))}"
                )


@_frozen
class LoraConfig:
    """``[trainer.lora]``: train low-rank adapters instead of every weight (peft)."""

    enabled: bool = False
    """Train LoRA adapters; vLLM then serves the base model with the adapter."""
    r: int = 8
    """Adapter rank."""
    alpha: int = 16
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """Dropout on the adapter's input."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """Module names that get adapters."""

    def __post_init__(self) -> None:
        _at_least("trainer.lora", self, 1, "r")


@_frozen
class TrainerConfig:
    """``[trainer]``: the optimizer and the loss."""

    lr: float = 1e-5
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global norm."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Advantages are divided by the reward std of the group, the batch, or not at all."""
    micro_batch_tokens: int = 4096
    """Tokens per forward/backward pass (padded tokens; with packing, the rows' own
    tokens); gradient accumulation above it."""
    device: str = "auto"
    """Where the trainer runs: auto (this process's CUDA device when there is one, else
    the CPU), cpu, cuda or cuda:N. Under a multi-process launch, each rank's own device."""
    precision: TrainerPrecision = "auto"
    """auto (bf16 on a GPU, fp32 on CPU), bf16 (bf16 autocast compute; weights, gradients
    and AdamW state stay fp32) or fp32."""
    packing: bool | None = None
    """Pack rows into micro-batches without padding (positions restart per row, attention
    stays within a row); unset: on with CUDA, off on CPU."""
    packed_attention: PackedAttention = "auto"
    """Attention of packed micro-batches: auto (varlen on CUDA in bf16, else rows),
    varlen (torch's FlashAttention varlen), rows (SDPA once per row), flash_attention_2
    (needs flash-attn) or flex_attention (GPU only)."""
    chunked_logprob: bool | None = None
    """Logprobs through the LM head in vocabulary tiles (TRL's chunked kernel), never the
    micro-batch's full logits, and only on the tokens the loss covers; unset: on with CUDA."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in backward (less memory, ~a third more compute)."""
    activation_offload: bool = False
    """Keep the activations saved for backward in (pinned) CPU memory (GPU memory for
    host transfers)."""
    compile: bool = False
    """torch.compile each decoder layer (dynamic shapes, so one compilation serves every
    micro-batch length): fuses the norms', rotary's and the MLP's elementwise work and
    saves fewer activations; the first step pays the compilation."""
    torch_threads: int | None = 1
    """Threads for the trainer's math on CPU (unset: torch's default)."""
    borrow_idle_cores: bool = True
    """On CPU, the trainer uses every core while no episode is being generated."""
    record_tokens: bool = True
    """Keep each trained token's trainer logprob, importance weight, advantage and mask in
    RUN_DIR/trainer_tokens.db (7 bytes a token; shown by `agentrl view`)."""
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    """The objective."""
    lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)
    """Low-rank adapters."""

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ConfigError(f"trainer.lr = {self.lr!r}; it must be > 0")
        _at_least("trainer", self, 1, "micro_batch_tokens")
        device = self.device
        index = device[5:] if device.startswith("cuda:") else ""
        if device not in ("auto", "cpu", "cuda") and not (index.isdigit() and index):
            raise ConfigError(
                f"trainer.device = {device!r} is not allowed; use auto, cpu, cuda or cuda:N"
            )
        for name, allowed in (
            ("precision", TrainerPrecision),
            ("packed_attention", PackedAttention),
        ):
            if getattr(self, name) not in typing.get_args(allowed):
                raise ConfigError(
                    f"trainer.{name} = {getattr(self, name)!r} is not allowed; use one of: "
                    f"{', '.join(typing.get_args(allowed))}"
                )


@_frozen
class TrainConfig:
    """``[train]``: the training loop."""

    steps: int = 20
    """Optimizer steps in total (a resumed run counts the ones already done)."""
    groups_per_step: int = 4
    """Complete groups per optimizer step."""
    mode: Literal["async", "sync"] = "async"
    """async: generation goes on while the trainer steps; sync: they take turns."""
    checkpoint_every: int = 5
    """Steps between trainer checkpoints (0: only at the end)."""

    def __post_init__(self) -> None:
        _at_least("train", self, 1, "steps", "groups_per_step")
        _at_least("train", self, 0, "checkpoint_every")
