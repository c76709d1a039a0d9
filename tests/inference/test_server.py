"""The HTTP client against a real `vllm serve` subprocess on 127.0.0.1."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from agentrl.errors import EngineStartupError
from agentrl.inference.base import InferenceConfig
from agentrl.inference.server import VLLMServer, VLLMServerClient
from tests.inference.client_contract import ClientContract

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[VLLMServerClient]:
    config = InferenceConfig()
    server = await VLLMServer.start(
        str(tiny_model), config, max_lora_rank=8, log_dir=tmp_path_factory.mktemp("server-logs")
    )
    try:
        async with VLLMServerClient(server.url, config) as http:
            yield http
    finally:
        await server.stop()
        assert server.process.returncode is not None
        await server.stop()  # safe twice


class TestServerClient(ClientContract):
    pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_server_that_never_gets_healthy_names_the_timeout(
    tiny_model: Path, tmp_path: Path
) -> None:
    config = InferenceConfig(startup_timeout_s=1.0)
    started: list[int] = []
    original = VLLMServer._wait_healthy

    async def record(self: VLLMServer, timeout_s: float) -> None:
        started.append(self.pid)
        await original(self, timeout_s)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(VLLMServer, "_wait_healthy", record)
        with pytest.raises(EngineStartupError, match=r"inference\.startup_timeout_s"):
            await VLLMServer.start(str(tiny_model), config, log_dir=tmp_path)
    assert started and not _alive(started[0]), "the half-started server was left running"


async def test_server_that_dies_at_startup_shows_its_log(tmp_path: Path) -> None:
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "not-a-real-architecture"}')
    (broken / "model.safetensors").write_bytes(b"not weights")  # passes agentrl's checks
    with pytest.raises(EngineStartupError, match="exited with code"):
        await VLLMServer.start(str(broken), InferenceConfig(), log_dir=tmp_path)
