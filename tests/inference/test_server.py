"""The HTTP client against a real `vllm serve` subprocess on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from agentrl.errors import EngineStartupError
from agentrl.inference.base import STREAM_INTERVAL, InferenceConfig, SamplingConfig
from agentrl.inference.server import VLLMServer, VLLMServerClient
from tests.inference.client_contract import PROMPT, ClientContract, long_greedy, token_counts

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


async def test_tokens_stream_in_steps_and_an_abort_keeps_an_exact_prefix(
    client: VLLMServerClient,
) -> None:
    """The server sends every STREAM_INTERVAL tokens (the first at once); an abort closes
    the stream and keeps what was sent, the uncut generation's prefix, from which the
    generation goes on to the same tokens."""
    full = await long_greedy(client, "steps-full")
    task = asyncio.create_task(
        client.generate(PROMPT, SamplingConfig(max_tokens=200, temperature=0.0), "steps")
    )
    await asyncio.sleep(0)  # the request is in flight
    seen = await token_counts(client, "steps", task)
    assert seen[:3] == [1, 1 + STREAM_INTERVAL, 1 + 2 * STREAM_INTERVAL], seen
    streamed = client.requests.sampled("steps")
    partial = await client.abort("steps")
    assert partial is not None and partial.finish_reason == "abort" and partial == await task
    n = len(partial.token_ids)
    assert streamed <= n < len(full.token_ids) and len(partial.logprobs) == n
    assert partial.token_ids == full.token_ids[:n]
    rest = await client.generate(
        PROMPT + list(partial.token_ids),
        SamplingConfig(max_tokens=200 - n, temperature=0.0),
        "steps-resume",
    )
    assert partial.token_ids + rest.token_ids == full.token_ids


async def test_requests_one_after_another_reuse_one_connection(
    client: VLLMServerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Generations one after another share one keep-alive connection: a finished stream
    hands its connection back to the pool (a new one a request would cost a TCP
    handshake, here and in the server)."""
    created, reused = [], []
    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(lambda *_: _note(created))
    trace.on_connection_reuseconn.append(lambda *_: _note(reused))
    session = aiohttp.ClientSession  # the client's own session, with the trace added
    monkeypatch.setattr(aiohttp, "ClientSession", lambda **kw: session(**kw, trace_configs=[trace]))
    async with VLLMServerClient(client.base_url, InferenceConfig()) as fresh:
        await fresh.model_name()
        for i in range(3):
            result = await fresh.generate(PROMPT, SamplingConfig(max_tokens=20), f"reuse-{i}")
            assert result.finish_reason in ("stop", "length")
    assert (len(created), len(reused)) == (1, 3), (created, reused)


async def _note(into: list[int]) -> None:
    into.append(1)
