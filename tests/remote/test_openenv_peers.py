"""agentrl's env server and client against OpenEnv's own (``openenv-core``) peers.

* ``agentrl serve-env`` driven by OpenEnv's clients: ``GenericEnvClient`` (reset with
  a seed, step, state; two sessions at once stay independent and match the env run
  locally) and ``MCPToolClient`` (a served env's tools through OpenEnv's step-based
  ``list_tools``/``call_tool``, and through the ``{"type": "mcp"}`` WebSocket message
  in OpenEnv's own message models).
* agentrl's client driving OpenEnv's server: the echo env that ``openenv init``
  renders, served by OpenEnv's ``create_app`` under uvicorn (``check_servers``, a
  session's reset and steps, and whole episodes through :class:`EpisodeRunner`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from openenv.core.env_server.mcp_types import WSMCPMessage, WSMCPResponse
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient

import envs  # noqa: F401  (registers the shipped envs)
from agentrl.config import EnvConfig, RolloutConfig
from agentrl.env import make_env
from agentrl.remote import EnvServerPool
from agentrl.remote.client import check_servers
from agentrl.rollout import EpisodeRunner
from agentrl.types import Task
from tests.faults.harness import Proc
from tests.remote.servers import render_echo_env, serve_echo_env, serve_env
from tests.rollout.fakes import ScriptedClient

pytestmark = pytest.mark.timeout(90)

GUESS = "agentrl/GuessNumber-v0"


def local_secret(seed: int) -> int:
    """The secret number of GuessNumber's episode ``seed``, from the env run in-process."""
    env = make_env(GUESS)
    env.reset(seed=seed)
    return int(env.unwrapped.secret)


# --- our server, OpenEnv's clients ------------------------------------------------------


async def test_openenv_generic_clients_drive_independent_sessions(tmp_path: Path) -> None:
    """Two GenericEnvClient sessions at once: each sees its own seed's episode (the same
    secret as the env run locally), its own step count, and ends when it guesses right."""
    _, url = serve_env(GUESS, tmp_path)
    seeds = (3, 4)
    secrets = [local_secret(s) for s in seeds]
    assert secrets[0] != secrets[1], "pick seeds with different secrets"

    async def play(seed: int, secret: int, wrong_guesses: int) -> dict[str, Any]:
        async with GenericEnvClient(base_url=url) as env:
            reset = await env.reset(seed=seed)
            assert reset.observation["text"] == "I am thinking of a number from 1 to 100."
            assert reset.observation["env_state"] == {"secret": secret, "guesses": 0}
            assert reset.done is False and reset.reward is None
            too_low = max(secret - 1, 1) if secret > 1 else None
            for _ in range(wrong_guesses):
                guess = too_low if too_low is not None else secret + 1
                step = await env.step({"message": f"Guess: {guess}"})
                assert step.observation["text"] == ("Higher." if too_low else "Lower."), step
                assert (step.reward, step.done) == (0.0, False)
            mid = await env.state()
            last = await env.step({"message": f"Guess: {secret}"})
            assert (last.reward, last.done) == (1.0, True), last
            assert last.observation["info"] == {"reason": "found it", "guesses": wrong_guesses + 1}
            return {"mid": mid, "end": await env.state()}

    a, b = await asyncio.wait_for(
        asyncio.gather(play(seeds[0], secrets[0], 2), play(seeds[1], secrets[1], 0)), 30
    )
    assert a["mid"]["step_count"] == 2 and b["mid"]["step_count"] == 0, (a, b)
    assert a["end"]["env_state"] == {"secret": secrets[0], "guesses": 3}
    assert b["end"]["env_state"] == {"secret": secrets[1], "guesses": 1}
    assert a["end"]["env_id"] == b["end"]["env_id"] == GUESS
    assert a["end"]["episode_id"] != b["end"]["episode_id"]


async def test_openenv_mcp_tool_client_calls_a_served_envs_tools(tmp_path: Path) -> None:
    """Calculator's ``calculator`` tool through MCPToolClient (step-based list_tools and
    call_tool, errors included) and through an ``{"type": "mcp"}`` message built and
    read with OpenEnv's WSMCPMessage/WSMCPResponse on the same session."""
    _, url = serve_env("agentrl/Calculator-v0", tmp_path)
    async with MCPToolClient(base_url=url) as env:
        await env.reset(seed=0)
        tools = await env.list_tools()
        assert [t.name for t in tools] == ["calculator"]
        assert tools[0].input_schema["required"] == ["expression"]
        assert await env.call_tool("calculator", expression="47*38") == "1786"
        with pytest.raises(RuntimeError, match="tool_not_found"):
            await env.call_tool("no_such_tool", x=1)

        request = WSMCPMessage(
            data={
                "jsonrpc": "2.0",
                "id": 7,
                "method": "tools/call",
                "params": {"name": "calculator", "arguments": {"expression": "2**10"}},
            }
        )
        reply = WSMCPResponse(**await env._send_and_receive(request.model_dump()))
        assert reply.data["id"] == 7, reply
        assert reply.data["result"]["content"] == [{"type": "text", "text": "1024"}], reply
        assert reply.data["result"]["isError"] is False

        listing = WSMCPMessage(data={"jsonrpc": "2.0", "id": 8, "method": "tools/list"})
        reply = WSMCPResponse(**await env._send_and_receive(listing.model_dump()))
        assert [t["name"] for t in reply.data["result"]["tools"]] == ["calculator"]


# --- OpenEnv's server, our client -------------------------------------------------------


@pytest.fixture(scope="module")
def echo_url(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """OpenEnv's echo env (``openenv init``'s template) under OpenEnv's server, for the
    whole module (this fixture ends it, not the per-test cleanup of Proc.live)."""
    root = tmp_path_factory.mktemp("openenv-echo")
    proc, url = serve_echo_env(render_echo_env(root), root)
    Proc.live.remove(proc)
    try:
        yield url
    finally:
        proc.kill()


async def test_our_client_drives_an_openenv_server(echo_url: str) -> None:
    """check_servers names the env from /metadata; a RemoteEnv session resets and steps
    the echo env, reading its observation's only text field, its reward and done."""
    config = check_servers(EnvConfig(url=echo_url, request_timeout_s=10.0))
    assert config.id == "EchoEnvironment"
    async with EnvServerPool.from_config(config) as pool:
        env = pool.make()
        await env.aopen()
        try:
            obs, info = await env.areset(seed=3)
            assert obs == "Echo Env environment ready!" and info == {}
            assert env.tools == () and env.system_prompt is None
            assert await env.astep("hello") == ("hello", pytest.approx(0.5), False, False, {})
            assert await env.astep("hi there") == ("hi there", pytest.approx(0.8), False, False, {})
            assert env.get_state() is None  # OpenEnv servers send no snapshots
        finally:
            await env.aclose()
        assert pool.describe()[0] | {"reason": ""} == {
            "url": echo_url,
            "up": True,
            "sessions": 0,
            "capacity": None,
            "opened": 1,
            "lost": 0,
            "reason": "",
        }


async def test_episodes_run_on_an_openenv_server(echo_url: str, tokenizer: Any) -> None:
    """EpisodeRunner runs whole episodes on the echo env: each turn's text comes back as
    the next observation, and the turn limit ends them (the echo env never does)."""
    config = check_servers(EnvConfig(url=echo_url))
    client = ScriptedClient(tokenizer, lambda p: "ping", max_model_len=512)
    async with EnvServerPool.from_config(config) as pool:
        runner = EpisodeRunner(client, tokenizer, RolloutConfig(max_turns=3), make=pool.make)
        tasks = [Task(f"echo#{i}", config.id, i) for i in range(4)]
        results = await asyncio.gather(*(runner.run(t, f"{t.task_id}/0", 0) for t in tasks))
    for trajectories in results:
        t = trajectories[-1]
        assert (t.status, t.reason) == ("truncated", "turn limit (3) reached"), (t.status, t.reason)
        assert [e["obs"] for e in t.env_log[1:]] == [[{"role": "user", "content": "ping"}]] * 3
        assert t.reward == pytest.approx(3 * 0.4)
