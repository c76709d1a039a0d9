"""Shared fixtures: the tiny model (built once per session), weights derived from it, and a
vLLM engine serving it (once per module that asks)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model cache private to this test session."""
    return tmp_path_factory.mktemp("agentrl-cache")


@pytest.fixture(scope="session")
def tiny_model(model_cache: Path) -> Path:
    from agentrl.models.tiny import build_tiny_model

    return build_tiny_model(cache_dir=model_cache)


@pytest.fixture(scope="session")
def perturbed_weights(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Safetensors of the tiny model with every weight changed (same architecture)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.2 * torch.randn(param.shape, generator=generator))
    out = tmp_path_factory.mktemp("perturbed")
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def lora_adapter(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A peft LoRA adapter for the tiny model with non-zero weights."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(2)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    config = LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        init_lora_weights=False,  # random A and B, so the adapter changes the output
    )
    peft_model = get_peft_model(model, config)
    out = tmp_path_factory.mktemp("lora")
    peft_model.save_pretrained(out)
    return out


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tiny_model: Path) -> AsyncIterator[Any]:
    """An in-process vLLM engine serving the tiny model (started once per test module)."""
    from agentrl.inference.base import InferenceConfig
    from agentrl.inference.engine import VLLMEngineClient

    engine = await VLLMEngineClient.start(InferenceConfig(model=str(tiny_model)))
    try:
        yield engine
    finally:
        await engine.close()


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)
