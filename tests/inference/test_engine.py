"""The in-process AsyncLLM client against real vLLM (CPU build, float32, eager)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from agentrl.errors import ModelNotFoundError
from agentrl.inference.engine import VLLMEngineClient
from tests.inference.client_contract import ClientContract

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tiny_model: Path) -> AsyncIterator[VLLMEngineClient]:
    engine = await VLLMEngineClient.start(str(tiny_model), max_lora_rank=8)
    try:
        yield engine
    finally:
        await engine.close()
        await engine.close()  # safe twice


class TestEngineClient(ClientContract):
    pass


async def test_missing_model_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        await VLLMEngineClient.start(str(tmp_path / "no-such-model"))
    with pytest.raises(ModelNotFoundError, match=r"no config\.json"):
        await VLLMEngineClient.start(str(tmp_path))
