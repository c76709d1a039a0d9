"""The trainer's models, loaded as configured: the policy (fp32 weights, the packed
attention, the chunked LM head, compiled layers, gradient checkpointing, a LoRA adapter)
and, when the loss has a KL term, the frozen reference model. The optimizer, devices and
training steps are :class:`agentrl.trainer.trainer.Trainer`'s."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from agentrl.config import TrainerConfig
from agentrl.errors import ConfigError
from agentrl.trainer import packing as packed_attention

__all__ = ["ModelLoad", "compile_layers"]


def compile_layers(model: Any) -> int:
    """``torch.compile`` every decoder layer of ``model`` in place; how many there are.

    The layers are the model's ``_no_split_modules`` classes (transformers names its
    repeated block there). Compiled with ``dynamic=True``: packed and padded micro-batches
    change length at every call, and one graph serves them all. The layers share it (their
    weights are the graph's inputs); should a torch version guard on each layer instead,
    dynamo's recompile limit is raised to twice the layer count, so that every layer gets
    its own graph rather than silently falling back to eager.

    Raises:
        ConfigError: the model names no decoder layer class.
    """
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ConfigError(
            f"trainer.compile = true but {type(model).__name__} names no decoder layer "
            f"(_no_split_modules is {sorted(names) or 'empty'}); set trainer.compile = false"
        )
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = max(
        torch._dynamo.config.cache_size_limit, 2 * len(layers)
    )
    for layer in layers:
        layer.compile(dynamic=True)
    return len(layers)


@dataclasses.dataclass(frozen=True, slots=True)
class ModelLoad:
    """How the trainer loads a model: its config and the switches resolved for the
    device (``packing``, ``attention``: the packed attention's implementation,
    ``chunked_logprob``), and the sampling ``temperature`` the fused LM head divides by."""

    config: TrainerConfig
    packing: bool
    attention: str
    chunked_logprob: bool
    temperature: float

    def policy_and_reference(
        self, auto: Any, model_path: str, device: torch.device
    ) -> tuple[Any, Any]:
        """The policy to train (with gradient checkpointing and a LoRA adapter, as
        configured) and the frozen reference model on ``device`` when the loss has a KL
        term (else None)."""
        cfg = self.config
        model = self.load(auto, model_path)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        if cfg.lora.enabled:
            from peft import LoraConfig, get_peft_model

            lora = cfg.lora
            config = LoraConfig(
                r=lora.r,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                target_modules=list(lora.target_modules),
            )
            return get_peft_model(model, config), None
        if cfg.loss.beta > 0:
            reference = self.load(auto, model_path)
            reference.eval().requires_grad_(False)
            reference.to(device)
            return model, reference
        return model, None

    def load(self, auto: Any, model_path: str) -> Any:
        """The model in fp32 with the packed attention and the chunked LM head, if set."""
        model = auto.from_pretrained(model_path, dtype=torch.float32)
        model.config.use_cache = False
        if self.packing:
            packed_attention.register()
            try:
                model.set_attn_implementation(self.attention)
            except (ImportError, ValueError) as e:
                raise ConfigError(
                    f"trainer.packed_attention = {self.config.packed_attention!r} "
                    f"({self.attention}) cannot run here: {e}; use 'auto' or 'rows'"
                ) from e
        if self.chunked_logprob:
            from trl.trainer.utils import add_fused_lm_head

            add_fused_lm_head(model, temperature=self.temperature)
        if self.config.compile:
            compile_layers(model)
        return model
