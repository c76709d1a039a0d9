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


def is_out_of_memory(error: BaseException) -> bool:
    """A CUDA (or other accelerator) out-of-memory error."""
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    return isinstance(error, oom)


def memory_error(error: BaseException, config: TrainerConfig, *, device: torch.device,
                 precision: str, packing: bool, chunked: bool, step: int,
                 parameters: int, trainable: int) -> TrainerMemoryError:  # fmt: skip
    """The error to raise for an out-of-memory ``error`` in step ``step + 1``.

    Lists, among LoRA, gradient checkpointing, a smaller micro-batch, bf16, packing
    and the chunked logprob, the settings that are not yet on, with what the step held.
    """
    held = ""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        held = (f" The GPU has {total / 2**30:.1f} GiB; the trainer held "
                f"{torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB at most "
                f"(other processes on it, vLLM included, hold the rest).")  # fmt: skip
    static = trainable * 16 + (parameters - trainable) * 4  # fp32 weights, grads, 2 moments
    fixes = []
    if not config.lora.enabled:
        fixes.append("trainer.lora.enabled = true (trains adapters: no full gradients or "
                     "AdamW state, about 12 bytes per parameter less)")  # fmt: skip
    if not config.gradient_checkpointing:
        fixes.append("trainer.gradient_checkpointing = true (recomputes activations in "
                     "backward)")  # fmt: skip
    fixes.append(f"a smaller trainer.micro_batch_tokens (now {config.micro_batch_tokens}; "
                 f"activations grow with it)")  # fmt: skip
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
