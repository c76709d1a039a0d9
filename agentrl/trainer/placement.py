"""Where the trainer runs and in what precision, and what to say when it does not fit.

``trainer.device``: ``auto`` is this process's CUDA device when torch sees one (under a
multi-process launch, the accelerator's device for this rank), else the CPU; ``cpu``,
``cuda`` and ``cuda:N`` are taken as written and refused at start when there is no such
device. ``trainer.precision``: ``auto`` is bf16 on a GPU that has it and fp32 elsewhere,
so the CPU tests stay exact. bf16 means autocast compute: the weights, their gradients
and the AdamW moments stay fp32 (the master copy); matmuls, attention and the LM head run
in bf16, log-softmax statistics in fp32.

A CUDA out-of-memory error inside a step becomes :class:`TrainerMemoryError`, which names
the settings that lower the trainer's memory and what the step held.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from agentrl.config import TrainerConfig
from agentrl.errors import ConfigError


class TrainerMemoryError(ConfigError):
    """A train step ran out of accelerator memory; the message says what would fit."""


def resolve_device(setting: str, accelerator: Any = None) -> torch.device:
    """The device ``trainer.device = setting`` means in this process.

    Raises:
        ConfigError: ``cuda``/``cuda:N`` without CUDA (or without device N), or a
            setting that disagrees with the launched accelerator's device.
    """
    if accelerator is not None:
        device = torch.device(accelerator.device)
        if setting != "auto" and torch.device(setting).type != device.type:
            raise ConfigError(
                f"trainer.device = {setting!r} but this launched process trains on "
                f"{device} (accelerate chose it); leave trainer.device = 'auto' under a "
                f"multi-process launch, or launch on the device you want"
            )
        return device
    if setting == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    device = torch.device(setting)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = (
                "this torch is built without CUDA"
                if torch.version.cuda is None
                else "torch sees no GPU (check CUDA_VISIBLE_DEVICES and the driver)"
            )
            raise ConfigError(
                f"trainer.device = {setting!r} but CUDA is not available: {why} "
                f"(torch {torch.__version__}); use trainer.device = 'auto' or 'cpu'"
            )
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise ConfigError(
                f"trainer.device = {setting!r} but torch sees {torch.cuda.device_count()} "
                f"GPU(s) (cuda:0 to cuda:{torch.cuda.device_count() - 1})"
            )
        return torch.device("cuda", index)
    return device


def resolve_precision(setting: str, device: torch.device) -> str:
    """``bf16`` or ``fp32``: what ``trainer.precision = setting`` means on ``device``.

    Raises:
        ConfigError: bf16 on a GPU without bf16 (before Ampere).
    """
    if setting == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return "bf16"
        return "fp32"
    if setting == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            f"trainer.precision = 'bf16' but {torch.cuda.get_device_name(device)} has no bf16; "
            f"use trainer.precision = 'fp32'"
        )
    return setting


def resolve_switch(value: bool | None, device: torch.device) -> bool:
    """An on/off setting whose unset value means 'on with CUDA, off on CPU'."""
    return device.type == "cuda" if value is None else bool(value)


def describe_device(device: torch.device) -> str:
    """One line: ``cuda:0 (NVIDIA H200, 139.8 GiB)`` or ``cpu (8 cores)``."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"{device} ({props.name}, {props.total_memory / 2**30:.1f} GiB)"
    return f"{device} ({len(os.sched_getaffinity(0))} cores)"


def describe_setup(
    config: TrainerConfig,
    device: torch.device,
    precision: str,
    attention: str,
    *,
    packing: bool,
    chunked: bool,
) -> str:
    """Where and how the trainer runs, in one line (``agentrl train`` says it at start)."""
    parts = [
        f"trainer on {describe_device(device)}",
        "bf16 autocast (fp32 weights and AdamW state)" if precision == "bf16" else "fp32",
    ]
    budget = f"{config.micro_batch_tokens} tokens"
    if packing:
        parts.append(f"packed micro-batches of <= {budget} ({attention} attention)")
    else:
        parts.append(f"padded micro-batches of <= {budget}")
    if chunked:
        parts.append("chunked logprob")
    if config.compile:
        parts.append("compiled layers")
    if config.gradient_checkpointing:
        parts.append("gradient checkpointing")
    if config.activation_offload:
        parts.append("activation offload")
    if config.lora.enabled:
        parts.append(f"LoRA r={config.lora.r}")
    return ", ".join(parts)


def setup_advice(config: TrainerConfig, device: torch.device) -> list[tuple[str, str]]:
    """Settings that measured slow on a GPU (an H200, benchmarks/results/
    trainer_cuda_h200.md): ``(level, line)`` pairs, level ``note`` (a default's) or
    ``warning`` (a setting worth changing); empty on CPU."""
    if device.type != "cuda":
        return []
    tokens = config.micro_batch_tokens
    if tokens >= 16_384:
        return []
    out = [
        (
            "note",
            f"trainer.micro_batch_tokens = {tokens}: small micro-batches leave the GPU "
            f"waiting on the host (an H200 ran the Qwen2.5-0.5B shape at 15.6 % MFU with "
            f"4,096, 40.8 % with 32,768, compile and checkpointing); raise it as memory "
            f"allows (trainer.gradient_checkpointing = true frees most activations)",
        )
    ]
    if config.compile:
        out.append(
            (
                "warning",
                f"trainer.compile = true with micro-batches of {tokens} tokens: "
                f"compiled layers were slower than eager ones below 16,384 tokens on "
                f"an H200 (1.18 against 0.86 s a step at 8,192)",
            )
        )
    return out


def is_out_of_memory(error: BaseException) -> bool:
    """A CUDA (or other accelerator) out-of-memory error."""
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    return isinstance(error, oom)


def memory_error(
    error: BaseException,
    config: TrainerConfig,
    *,
    device: torch.device,
    precision: str,
    packing: bool,
    chunked: bool,
    step: int,
    parameters: int,
    trainable: int,
) -> TrainerMemoryError:
    """The error to raise for an out-of-memory ``error`` in step ``step + 1``.

    Lists, among LoRA, gradient checkpointing, a smaller micro-batch, bf16, packing
    and the chunked logprob, the settings that are not yet on, with what the step held.
    """
    held = ""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        held = (
            f" The GPU has {total / 2**30:.1f} GiB; the trainer held "
            f"{torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB at most "
            f"(other processes on it, vLLM included, hold the rest)."
        )
    static = trainable * 16 + (parameters - trainable) * 4  # fp32 weights, grads, 2 moments
    fixes = []
    if not config.lora.enabled:
        fixes.append(
            "trainer.lora.enabled = true (trains adapters: no full gradients or "
            "AdamW state, about 12 bytes per parameter less)"
        )
    if not config.gradient_checkpointing:
        fixes.append("trainer.gradient_checkpointing = true (recomputes activations in backward)")
    fixes.append(
        f"a smaller trainer.micro_batch_tokens (now {config.micro_batch_tokens}; "
        f"activations grow with it)"
    )
    if precision != "bf16":
        fixes.append("trainer.precision = 'bf16' (half-size activations)")
    if not packing:
        fixes.append("trainer.packing = true (no padding tokens)")
    if not chunked:
        fixes.append("trainer.chunked_logprob = true (no full-vocabulary logits)")
    if not config.activation_offload:
        fixes.append("trainer.activation_offload = true (activations wait in CPU memory)")
    return TrainerMemoryError(
        f"the trainer ran out of memory on {device} in step {step + 1} "
        f"({type(error).__name__}). Its model has {parameters / 1e6:,.0f}M parameters "
        f"({trainable / 1e6:,.0f}M trained: about {static / 2**30:.1f} GiB of fp32 weights, "
        f"gradients and AdamW state before any activation).{held} Settings that make it "
        f"fit: " + "; ".join(fixes) + "."
    )


@dataclasses.dataclass(frozen=True, slots=True)
class ColocatedPlan:
    """What the trainer and an in-process vLLM engine need of one GPU (an estimate)."""

    total: int
    """The GPU's memory, bytes."""
    trainer_static: int
    """fp32 weights, gradients and AdamW moments of what is trained (the reference model
    too): held all the time."""
    trainer_activations: int
    """One micro-batch's activations and logits at its peak: held during a step."""
    vllm: int
    """vLLM's weights and KV cache (its gpu_memory_utilization share when set)."""
    sleeping: bool
    """vLLM sleeps during train steps (``inference.sleep_during_train``)."""

    @property
    def peak(self) -> int:
        if self.sleeping:  # the trainer's step and vLLM's share take turns
            return self.trainer_static + max(self.trainer_activations, self.vllm)
        return self.trainer_static + self.trainer_activations + self.vllm

    def fits(self) -> bool:
        return self.peak <= self.total

    def describe(self) -> str:
        gib = 2**30
        return (
            f"trainer ~{self.trainer_static / gib:.1f} GiB held + ~"
            f"{self.trainer_activations / gib:.1f} GiB per step, vLLM ~{self.vllm / gib:.1f}"
            f" GiB{' (asleep during steps)' if self.sleeping else ''}: ~"
            f"{self.peak / gib:.1f} of {self.total / gib:.1f} GiB"
        )


_VLLM_OVERHEAD = 2**30
"""vLLM's own working memory besides weights and KV cache (activations, CUDA context)."""


def colocated_plan(
    model_config: Any,
    parameters: int,
    trainer: TrainerConfig,
    inference: Any,
    *,
    precision: str,
    chunked: bool,
    total: int,
) -> ColocatedPlan:
    """The estimate for the model of ``model_config`` (a transformers config) with
    ``parameters`` parameters, the trainer and ``inference`` (an InferenceConfig) on one
    GPU of ``total`` bytes.

    Trainer: 16 bytes per trained parameter (fp32 weights, gradients, two AdamW
    moments), 4 per frozen one (LoRA's base, a reference model); in bf16 also autocast's
    bf16 copy of the weights (2 bytes a parameter) during a micro-batch. Activations of
    one micro-batch of ``micro_batch_tokens`` tokens, per token, hidden unit and layer:
    80 bytes in bf16 autocast and 135 in fp32, measured on an H200 with the Qwen2.5-0.5B
    and 1.5B shapes (77-85 and 133; ``benchmarks/results/trainer_cuda_h200.md``: more
    than the 34 of Korthikanti et al., 2022, since transformers keeps the residual stream,
    the norms and rotary's q and k in fp32 under autocast and Qwen2's MLP is 5.4-5.8x
    wide). With gradient checkpointing or activation offload: each layer's fp32 input
    (4 bytes) plus one layer's working set. Unless the logprob is chunked, the
    full-vocabulary logits and their gradient (4 bytes each in fp32, 2 in bf16).
    vLLM: ``gpu_memory_utilization`` of the GPU when set, else its weights in
    ``inference.dtype``, the KV cache (``kv_cache_mib``) and 1 GiB of working memory.
    """
    text = (
        model_config.get_text_config()
        if hasattr(model_config, "get_text_config")
        else (model_config)
    )
    hidden, layers = int(text.hidden_size), int(text.num_hidden_layers)
    vocab = int(text.vocab_size)
    tokens = trainer.micro_batch_tokens
    if trainer.lora.enabled:  # the adapters are small next to the frozen base
        static = parameters * 4
    else:
        static = parameters * 16 + (parameters * 4 if trainer.loss.beta > 0 else 0)
    bf16 = precision == "bf16"
    per_layer = (80 if bf16 else 135) * tokens * hidden
    if trainer.gradient_checkpointing or trainer.activation_offload:
        activations = per_layer + 4 * tokens * hidden * layers
    else:
        activations = per_layer * layers
    if bf16:
        activations += 2 * parameters  # autocast's bf16 weights
    if not chunked:
        activations += 2 * tokens * vocab * (2 if bf16 else 4)
    if inference.gpu_memory_utilization is not None:
        vllm = int(inference.gpu_memory_utilization * total)
    else:
        width = 4 if str(inference.dtype) in ("float32", "float") else 2
        vllm = parameters * width + inference.kv_cache_bytes + _VLLM_OVERHEAD
    return ColocatedPlan(total, static, activations, vllm, bool(inference.sleep_during_train))


def colocated_error(plan: ColocatedPlan, trainer: TrainerConfig, inference: Any) -> ConfigError:
    """The start-time error for a ``plan`` that does not fit: what would make it fit."""
    fixes = []
    if inference.gpu_memory_utilization is not None:
        fixes.append(
            f"a smaller inference.gpu_memory_utilization (now {inference.gpu_memory_utilization})"
        )
    else:
        fixes.append(f"a smaller inference.kv_cache_mib (now {inference.kv_cache_mib})")
    if not inference.sleep_during_train:
        fixes.append(
            "train.mode = 'sync' with inference.sleep_during_train = true (vLLM "
            "frees the GPU during each step)"
        )
    if not trainer.lora.enabled:
        fixes.append("trainer.lora.enabled = true (no full gradients or AdamW state)")
    if not trainer.gradient_checkpointing:
        fixes.append("trainer.gradient_checkpointing = true")
    fixes.append(f"a smaller trainer.micro_batch_tokens (now {trainer.micro_batch_tokens})")
    fixes.append("inference.mode = 'server' with vLLM on another GPU")
    return ConfigError(
        f"the trainer and vLLM do not fit on one GPU together (an estimate: "
        f"{plan.describe()}). Settings that make it fit: " + "; ".join(fixes) + "."
    )
