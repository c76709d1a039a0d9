"""An env whose tools live in an MCP server: examples/MCPArithmetic-v0.

The agent is asked "What is A + B?" (or A * B) and may call ``add`` and ``multiply``,
which are not Python functions here: :func:`agentrl.tools.mcp.from_mcp` lists them from
``calc_server.py`` (an MCP server over stdio, started by the ``mcp`` client) when this
module is imported, and every episode gets its own session with the server for its
calls. Import it with ``env.imports = ["examples/mcp_tools/mcp_env.py"]`` or
``agentrl rollout ... --import examples/mcp_tools/mcp_env.py``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from agentrl.env import TextEnv, final_answer_step, register_env
from agentrl.tools.mcp import from_mcp

SERVER = [sys.executable, str(Path(__file__).with_name("calc_server.py"))]
LOG = {k: os.environ[k] for k in ("CALC_SERVER_LOG",) if k in os.environ}
"""A stdio server gets only a few safe variables of ours (the ``mcp`` client's rule),
plus those given: here the server's call log, which the tests read."""
CALC = from_mcp(SERVER, include=["add", "multiply"], env=LOG)
"""The server's ``add`` and ``multiply``, a session per episode."""


class MCPArithmeticEnv(TextEnv):
    """One arithmetic question; reward 1 for the right ``Answer: N``."""

    tools = CALC
    system_prompt = "Use the add and multiply tools, then reply with 'Answer: N'."

    def __init__(self, max_operand: int = 999) -> None:
        self.max_operand = max_operand
        self._problem: tuple[int, str, int] = (0, "+", 0)

    @property
    def target(self) -> int:
        a, op, b = self._problem
        return a + b if op == "+" else a * b

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        a, b = (int(x) for x in self.np_random.integers(0, self.max_operand + 1, size=2))
        self._problem = (a, str(self.np_random.choice(["+", "*"])), b)
        return f"What is {a} {self._problem[1]} {b}?", {"target": self.target}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return final_answer_step(action, self.target)

    def get_state(self) -> dict[str, Any]:
        return {"problem": list(self._problem)}

    def set_state(self, state: dict[str, Any]) -> None:
        a, op, b = state["problem"]
        self._problem = (int(a), str(op), int(b))


register_env("examples/MCPArithmetic-v0", MCPArithmeticEnv, max_episode_steps=8)
