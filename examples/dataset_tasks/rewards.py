"""The verifier of the arithmetic rows: 1.0 when the final turn says ``Answer: N`` with
N the row's ``answer``, else 0.0. A plain verifier (``f(completion, **columns)``);
``trl_exact`` is the same rule with TRL's reward-function signature."""

from __future__ import annotations

import re

ANSWER = re.compile(r"Answer:\s*(-?\d+)")


def exact(completion: str, answer: int) -> float:
    found = ANSWER.findall(completion)
    return float(bool(found) and found[-1] == str(answer))


def trl_exact(
    prompts: list[str], completions: list[str], answer: list[int], **kwargs: object
) -> list[float]:
    return [exact(c, a) for c, a in zip(completions, answer, strict=True)]
