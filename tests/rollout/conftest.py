"""Fixtures of the rollout tests: one real vLLM engine per test module, and the tokenizer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from transformers import AutoTokenizer

from agentrl.inference.base import InferenceConfig
from agentrl.inference.engine import VLLMEngineClient


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tiny_model: Path) -> AsyncIterator[VLLMEngineClient]:
    """An in-process vLLM engine serving the tiny model (started once per module)."""
    engine = await VLLMEngineClient.start(InferenceConfig(model=str(tiny_model)))
    try:
        yield engine
    finally:
        await engine.close()


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model)
