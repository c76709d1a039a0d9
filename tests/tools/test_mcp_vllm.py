"""An agent calls an MCP server's tool in a real-vLLM rollout.

The env is the family tests' AddEnv ("What is 2 + 3?") with its ``add`` tool taken from
the example MCP server (``examples/mcp_tools/calc_server.py``) instead of a Python
function, so the model's prompt shows the server's schema. The model is a tiny model
with the Llama 3.2 family's tokenizer and template, taught that episode
(:mod:`tests.models.family_model`: call ``add(a=2, b=3)``, then answer ``Answer: 5``),
sampled greedily by vLLM's in-process engine. Checked: vLLM's tokens are the call, the
runner sent it to the MCP server (its call log names the server's process), the
server's answer went back into the conversation, and the episode is token for token
the one the model was taught.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from agentrl.config import InferenceConfig, RolloutConfig
from agentrl.env import register_env
from agentrl.inference.engine import VLLMEngineClient
from agentrl.rollout import EpisodeRunner
from agentrl.tools.mcp import from_mcp
from agentrl.types import Task
from tests.models.families import AddEnv, RecordingClient, family
from tests.models.family_model import SETTINGS, TaughtModel, build_family_model
from tests.tools.test_mcp import LOG, SERVER

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

ENV_ID = "tests/FamilyAddMCP-v0"


@pytest.fixture(scope="module")
def call_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    log = tmp_path_factory.mktemp("mcp") / "calls.log"
    log.touch()
    return log


@pytest.fixture(scope="module")
def taught(model_cache: Path, call_log: Path) -> TaughtModel:
    class MCPAddEnv(AddEnv):
        tools = from_mcp(SERVER, include=["add"], env={LOG: str(call_log)})

    register_env(ENV_ID, MCPAddEnv)
    model = build_family_model(family("llama3.2"), model_cache, env_id=ENV_ID)
    call_log.write_text("")  # the scripted teaching episode called it too
    return model


async def test_the_model_calls_the_mcp_tool_through_real_vllm(
    taught: TaughtModel, call_log: Path
) -> None:
    from transformers import AutoTokenizer

    from agentrl.chat.formats import resolve_chat_format

    tokenizer = AutoTokenizer.from_pretrained(taught.path)
    assert '"name": "add"' in tokenizer.decode(taught.token_ids), "the server's schema"
    config = InferenceConfig(max_model_len=512, kv_cache_mib=64)
    rollout = RolloutConfig(max_turns=6, max_tool_calls=4, max_tokens_per_turn=120, temperature=0.0)
    async with await VLLMEngineClient.start(str(taught.path), config) as engine:
        client = RecordingClient(engine, tokenizer, taught.family.eos)
        runner = EpisodeRunner(
            client, tokenizer, rollout, chat=resolve_chat_format(tokenizer, SETTINGS)
        )
        (traj,) = await runner.run(Task("t#0", ENV_ID, 0), "t#0/0")
    assert (traj.status, traj.reward) == ("finished", 1.0), traj.reason
    call = traj.env_log[1]
    assert (call["tool"], call["arguments"], call["result"]) == ("add", {"a": 2, "b": 3}, "5")
    first = (await asyncio.to_thread(call_log.read_text)).splitlines()[0].split()
    assert first[1] == "add" and int(first[0]) != os.getpid(), "the call reached the server"
    assert traj.token_ids.tolist() == taught.token_ids  # the taught episode, token for token
