"""Replaying a recorded episode's env log on a fresh env, and comparing everything.

An episode's ``env_log`` holds its reset observation, then every env step (action,
observation, reward, end flags) and every tool call that ran (name, arguments,
result) in order, each with the env's ``get_state()`` snapshot after it when the env
has one. :func:`verify_log` rebuilds the env from the seed, replays the log, and
reports the first entry that now differs. ``agentrl replay --verify`` uses it, and the
runner uses it on the first episodes of each env to find envs whose episodes do not
replay from their seed (for example ones drawing from the process-wide ``random``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import math
from typing import Any

from agentrl.chat import as_messages
from agentrl.env import EnvHandle, supports_state
from agentrl.tools import ToolCall, ToolSet
from agentrl.types import Task


@dataclasses.dataclass(frozen=True, slots=True)
class VerifyResult:
    steps: int
    """Log entries replayed (the reset not counted)."""
    difference: str | None
    """The first difference, or None when everything matched."""


def verify_log(env: Any, task: Task, log: list[dict[str, Any]]) -> VerifyResult:
    """Reset ``env`` (fresh) with the task's seed, replay ``log``, compare every entry."""
    toolset = ToolSet(EnvHandle(env).tools)
    try:
        obs, _ = env.reset(seed=task.seed, options=task.options)
        problem = _compare(log[0], {"obs": obs}, env, "reset") if log else None
        if problem:
            return VerifyResult(0, problem)
        for i, entry in enumerate(log[1:], start=1):
            if "tool" in entry:
                now: dict[str, Any] = {"result": _call_tool(toolset, entry)}
                where = f"entry {i} (tool call {entry['tool']}({short(entry['arguments'], 60)}))"
            else:
                obs, reward, terminated, truncated, _ = env.step(entry["action"])
                now = {
                    "obs": obs,
                    "reward": float(reward),
                    "terminated": bool(terminated),
                    "truncated": bool(truncated),
                }
                where = f"step {i} (action {short(entry['action'])})"
            problem = _compare(entry, now, env, where)
            if problem:
                return VerifyResult(i, problem)
        return VerifyResult(len(log) - 1, None)
    finally:
        env.close()


def _compare(entry: dict[str, Any], now: dict[str, Any], env: Any, where: str) -> str | None:
    if "obs" in now:
        now["obs"] = as_messages(now["obs"])
    if "state" in entry and supports_state(env):
        now["state"] = json.loads(json.dumps(env.unwrapped.get_state()))
    for key, value in now.items():
        recorded = entry.get(key)
        if key == "reward" and recorded is not None:
            same = math.isclose(float(recorded), value, abs_tol=1e-9)
        else:
            same = recorded == value
        if not same:
            return f"{where}: recorded {key} {short(recorded)}, the env now gives {short(value)}"
    return None


def _call_tool(toolset: ToolSet, entry: dict[str, Any]) -> str:
    """Call a recorded tool call again, synchronously (in a thread with its own loop)."""
    call = ToolCall(entry["tool"], entry["arguments"])
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, toolset.call(call)).result().content


def short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
