"""Synthetic demonstrations of the calculator env for the SFT warm start.

A *tool* demonstration calls the calculator with the problem's expression and copies
the result into ``Answer: N``; a *guess* demonstration answers at once with an
estimate (the true value rounded to one significant figure), as a model that does not
use its tools would. The mix sets how often the warm-started model reaches for the
tool: RL has to discover that the tool pays.
"""

from __future__ import annotations

import json
import random
from typing import Any

from agentrl.types import Message
from envs.calculator import CalculatorEnv

SFT_SEED_BASE = 50_000_000
"""Demonstration problems use env seeds from here; RL and evaluation use others."""


def estimate(value: int) -> int:
    """``value`` rounded to one significant figure: 1786 -> 2000, -47 -> -50."""
    if abs(value) < 10:
        return value
    scale = 10 ** (len(str(abs(value))) - 1)
    return int(round(value / scale) * scale)


def tool_call_text(expression: str) -> str:
    """An assistant turn that calls the calculator, as the chat template writes one."""
    payload = json.dumps({"expression": expression})
    return f'<tool_call>\n{{"name": "calculator", "arguments": {payload}}}\n</tool_call>'


def demonstration(env: CalculatorEnv, seed: int, use_tool: bool) -> list[Message]:
    """One episode of ``env`` (reset with ``seed``) as chat messages."""
    question, info = env.reset(seed=seed)
    a, op, b = env.get_state()["problem"]
    target = int(info["target"])
    messages: list[Message] = [
        {"role": "system", "content": env.system_prompt},
        {"role": "user", "content": question},
    ]
    if use_tool:
        messages += [
            {"role": "assistant", "content": tool_call_text(f"{a}{op}{b}")},
            {"role": "tool", "name": "calculator", "content": str(target)},
            {"role": "assistant", "content": f"Answer: {target}"},
        ]
    else:
        messages.append({"role": "assistant", "content": f"Answer: {estimate(target)}"})
    return messages


def problems(seeds: range, **env_kwargs: Any) -> set[tuple[int, str, int]]:
    """The problems the env poses for these seeds (e.g. the evaluation's)."""
    env = CalculatorEnv(**env_kwargs)
    out = set()
    for seed in seeds:
        env.reset(seed=seed)
        a, op, b = env.get_state()["problem"]
        out.add((int(a), str(op), int(b)))
    return out


def demonstrations(
    count: int,
    tool_fraction: float,
    *,
    offset: int = 0,
    exclude: set[tuple[int, str, int]] = frozenset(),  # type: ignore[assignment]
    **env_kwargs: Any,
) -> list[list[Message]]:
    """``count`` demonstrations, a ``tool_fraction`` of them using the tool.

    Problems in ``exclude`` (the held-out evaluation problems) are skipped.
    """
    env = CalculatorEnv(**env_kwargs)
    rng = random.Random(offset)
    out: list[list[Message]] = []
    seed = SFT_SEED_BASE + offset
    while len(out) < count:
        use_tool = rng.random() < tool_fraction
        demo = demonstration(env, seed, use_tool)
        seed += 1
        a, op, b = env.get_state()["problem"]
        if (int(a), str(op), int(b)) not in exclude:
            out.append(demo)
    return out
