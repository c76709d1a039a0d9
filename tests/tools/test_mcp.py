"""MCP tools (``agentrl.tools.mcp.from_mcp``) against a real MCP server.

The server is the example's ``calc_server.py`` (the ``mcp`` package's own server, over
stdio, or Streamable HTTP on 127.0.0.1), started by the ``mcp`` package's own client.
Checked: schemas come from ``tools/list``; results, ``isError`` results and calls past
their deadline become the usual tool results and error kinds; a session per episode is
a server process per episode, closed when the episode ends, and a shared one is one
process; a server that dies mid-episode fails that call with a clear error and the next
call starts it again; an episode of the example env calls the tools through the runner.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from agentrl.config import RolloutConfig
from agentrl.rollout import EpisodeRunner
from agentrl.tools import ToolCall, ToolSet
from agentrl.tools.mcp import MCPError, from_mcp
from agentrl.types import Task
from tests.inference.test_server import _alive
from tests.rollout.fakes import ScriptedClient

ROOT = Path(__file__).resolve().parents[2]
SERVER = [sys.executable, str(ROOT / "examples" / "mcp_tools" / "calc_server.py")]
LOG = "CALC_SERVER_LOG"
ADD_PARAMETERS = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "description": "The first number."},
        "b": {"type": "integer", "description": "The second number."},
    },
    "required": ["a", "b"],
}

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def call_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The server's call log: one line 'PID TOOL ARGS' per call (CALC_SERVER_LOG)."""
    log = tmp_path / "calls.log"
    log.touch()
    monkeypatch.setenv(LOG, str(log))  # for servers we start, and the example env's
    return log


def _pids(log: Path) -> list[int]:
    return [int(line.split()[0]) for line in log.read_text().splitlines()]


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while _alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still there"
        time.sleep(0.01)


def test_tools_list_into_schemas_and_calls_give_results_and_error_kinds(call_log: Path) -> None:
    tools = from_mcp(SERVER, env={LOG: str(call_log)})
    assert [t.name for t in tools] == ["add", "multiply", "divide", "wait"]
    function = {"name": "add", "description": "Add two integers.", "parameters": ADD_PARAMETERS}
    assert tools[0].schema == {"type": "function", "function": function}
    assert [t.name for t in from_mcp(" ".join(SERVER), include=["divide"])] == ["divide"]

    async def run() -> list[Any]:
        toolset = ToolSet(tools, timeout_s=5.0)
        calls = [
            ToolCall("add", {"a": 2, "b": 3}),
            ToolCall("multiply", {"a": 4, "b": 5}),
            ToolCall("divide", {"a": 1, "b": 0}),
            ToolCall("add", {"a": "x", "b": 1}),
            ToolCall("wait", {"seconds": 0.01}),
        ]
        results = [await toolset.call(c) for c in calls]
        toolset.tools["wait"].timeout_s = 0.2
        results.append(await toolset.call(ToolCall("wait", {"seconds": 30})))
        await toolset.aclose()
        return [(r.content, r.error) for r in results] + [dict(toolset.errors)]

    out = asyncio.run(run())
    assert out[:3] == [("5", None), ("20", None), ("Error: division by zero", "tool_exception")]
    assert out[3][1] == "bad_arguments" and "'a' must be integer" in out[3][0]  # never sent
    assert out[4] == ("waited", None)
    assert out[5] == ("Error: wait took longer than 0.2 s", "timeout")
    assert out[6] == {"tool_exception": 1, "bad_arguments": 1, "timeout": 1}
    assert len(_pids(call_log)) == 5 and len(set(_pids(call_log))) == 1, "one session"


def test_a_session_per_episode_or_one_shared(call_log: Path) -> None:
    env = {LOG: str(call_log)}
    episode, shared = from_mcp(SERVER, env=env), from_mcp(SERVER, session="shared", env=env)

    async def two_episodes(tools: list[Any]) -> None:
        sets = [ToolSet(tools), ToolSet(tools)]
        for toolset in sets:  # add and multiply of one episode share its session
            assert (await toolset.call(ToolCall("add", {"a": 1, "b": 1}))).content == "2"
            assert (await toolset.call(ToolCall("multiply", {"a": 2, "b": 2}))).content == "4"
        for toolset in sets:
            await toolset.aclose()

    asyncio.run(two_episodes(episode))
    per_episode = _pids(call_log)
    assert len(per_episode) == 4 and len(set(per_episode)) == 2, per_episode
    assert not any(_alive(p) for p in set(per_episode)), "each episode's server ended with it"
    call_log.write_text("")
    asyncio.run(two_episodes(shared))
    assert len(set(_pids(call_log))) == 1, "one session for all episodes"


def test_a_server_that_dies_fails_the_call_then_starts_again(
    call_log: Path, record_fault: Any
) -> None:
    async def run() -> list[Any]:
        toolset = ToolSet(from_mcp(SERVER, env={LOG: str(call_log)}), timeout_s=10.0)
        first = await toolset.call(ToolCall("add", {"a": 1, "b": 2}))
        (pid,) = _pids(call_log)
        os.kill(pid, signal.SIGKILL)
        await asyncio.to_thread(_wait_gone, pid)
        lost = await toolset.call(ToolCall("add", {"a": 1, "b": 2}))
        again = await toolset.call(ToolCall("add", {"a": 3, "b": 4}))
        await toolset.aclose()
        return [first, lost, again, pid]

    first, lost, again, pid = asyncio.run(run())
    record_fault(
        "MCP server SIGKILLed mid-episode", injected=1, survived=int(again.content == "7"), lost=0
    )
    assert (first.content, first.error) == ("3", None)
    assert lost.error == "tool_exception" and "calc_server.py failed" in lost.content, lost
    assert (again.content, again.error) == ("7", None)
    assert _pids(call_log)[-1] != pid, "a new server process"


def test_a_server_that_cannot_start_is_one_clear_error() -> None:
    started = time.monotonic()
    with pytest.raises(MCPError, match=r"MCP server .*no_such_server\.py did not list its tools"):
        from_mcp([sys.executable, "/nonexistent/no_such_server.py"])
    assert time.monotonic() - started < 30
    with pytest.raises(MCPError, match=r"has no tools \['subtract'\]"):
        from_mcp(SERVER, include=["subtract"])


def test_streamable_http_server(call_log: Path, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([*SERVER, "--http", str(port)], stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
            except urllib.error.HTTPError:
                break  # it answers (404 at /)
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "server not up"
                time.sleep(0.2)
            else:
                break
        tools = from_mcp(url, include=["add"])

        async def run() -> Any:
            toolset = ToolSet(tools)
            result = await toolset.call(ToolCall("add", {"a": 20, "b": 22}))
            await toolset.aclose()
            return result

        assert asyncio.run(run()).content == "42"
        assert _pids(call_log) == [proc.pid]
    finally:
        proc.kill()
        proc.wait()


async def test_an_episode_of_the_example_env_calls_the_server(
    tokenizer: Any,
    call_log: Path,
) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "mcp_env_example", ROOT / "examples" / "mcp_tools" / "mcp_env.py"
    )
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))  # registers the env

    def reply(prompt_ids: Any) -> str:
        text = tokenizer.decode(prompt_ids)
        question = text.rsplit("What is ", 1)[1].split("?")[0]
        a, op, b = question.split()
        if "<tool_response>" not in text:
            name = "add" if op == "+" else "multiply"
            return (
                f'<tool_call>{{"name": "{name}", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
            )
        return f"Answer: {text.rsplit('<tool_response>', 1)[1].split('<')[0].strip()}"

    runner = EpisodeRunner(
        ScriptedClient(tokenizer, reply),
        tokenizer,
        RolloutConfig(max_turns=4, max_tokens_per_turn=64),
    )
    trajectories = await asyncio.gather(
        *(runner.run(Task(f"t{i}", "examples/MCPArithmetic-v0", seed=i), f"e{i}") for i in range(4))
    )
    for (traj,) in trajectories:
        assert (traj.status, traj.reward) == ("finished", 1.0), traj.reason
        (call,) = [e for e in traj.env_log if "tool" in e]
        assert call["tool"] in ("add", "multiply") and call["result"].lstrip("-").isdigit()
    pids = _pids(call_log)  # the episodes' calls, then those of the runner's replay check
    assert len(pids) >= 4 and len(set(pids)) == len(pids), "a session (a process) per episode"
    await asyncio.sleep(0.5)
    assert not any(_alive(p) for p in pids), "closed with its episode"
