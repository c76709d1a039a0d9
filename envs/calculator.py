"""Calculator: arithmetic word problems, a calculator tool, one final answer.

The env of the main demo. The agent may call ``calculator`` (run by the rollout
engine) and ends the episode with a turn containing ``Answer: N``; reward 1 if N is
right. A turn without an answer or a tool call ends the episode with reward 0.
"""

from __future__ import annotations

from typing import Any

from agentrl.env import TextEnv, final_answer_step
from tools.calculator import calculator


class CalculatorEnv(TextEnv):
    tools = (calculator,)
    system_prompt = "Use the calculator tool, then reply with 'Answer: N'."

    def __init__(self, max_operand: int = 999, ops: str = "+-*") -> None:
        self.max_operand = max_operand
        self.ops = ops
        self._problem: tuple[int, str, int] = (0, "+", 0)

    @property
    def target(self) -> int:
        a, op, b = self._problem
        return {"+": a + b, "-": a - b, "*": a * b}[op]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        rng = self.np_random
        a, b = (int(x) for x in rng.integers(0, self.max_operand + 1, size=2))
        self._problem = (a, str(rng.choice(list(self.ops))), b)
        return f"What is {a} {self._problem[1]} {b}?", {"target": self.target}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return final_answer_step(action, self.target)

    def get_state(self) -> dict[str, Any]:
        return {"problem": list(self._problem)}

    def set_state(self, state: dict[str, Any]) -> None:
        a, op, b = state["problem"]
        self._problem = (int(a), str(op), int(b))
