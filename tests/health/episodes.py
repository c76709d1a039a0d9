"""Real trajectories and step rows for the health tests: a healthy calculator-like run,
and episodes built turn by turn (tokens, spans, messages) as the runner records them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from agentrl.types import Group, Task, TokenSpan, Trajectory


def episode(
    episode_id: str,
    turns: Sequence[Sequence[int]],
    *,
    reward: float = 1.0,
    status: str = "finished",
    tool_results: Sequence[str] = (),
    info: dict[str, Any] | None = None,
    attempt: int = 0,
    logprob: float = -0.5,
    texts: Sequence[str] | None = None,
    task_id: str | None = None,
) -> Trajectory:
    """One recorded episode: a 3-token prompt, then per assistant turn its tokens, each
    followed (but the last) by a 2-token tool result."""
    ids: list[int] = [1, 2, 3]
    spans = [TokenSpan("prompt", 0, 3, 0)]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 47 * 38?"}]
    for i, turn in enumerate(turns):
        spans.append(TokenSpan("assistant", len(ids), len(ids) + len(turn), i))
        ids += list(turn)
        text = texts[i] if texts is not None else " ".join(map(str, turn))
        messages.append({"role": "assistant", "content": text})
        if i < len(turns) - 1:
            spans.append(TokenSpan("tool", len(ids), len(ids) + 2, i + 1))
            ids += [5, 6]
            result = tool_results[i] if i < len(tool_results) else "ok"
            messages.append({"role": "tool", "content": result})
    mask = np.zeros(len(ids), np.int8)
    for s in spans:
        if s.kind == "assistant":
            mask[s.start : s.end] = 1
    logprobs = np.where(mask == 1, logprob, math.nan)
    return Trajectory(
        episode_id=episode_id,
        task_id=task_id or episode_id.split("/")[0],
        env_id="calc",
        seed=0,
        token_ids=ids,
        logprobs=logprobs,
        versions=np.where(mask == 1, 0, -1),
        loss_mask=mask,
        spans=tuple(spans),
        messages=messages,
        turn_rewards=[reward],
        reward=reward,
        status=status,
        info=dict(info or {}),
        attempt=attempt,  # type: ignore[arg-type]
    )


def group(task: str, trajectories: Sequence[Trajectory]) -> Group:
    return Group(Task(task, "calc", 0), len(trajectories), list(trajectories))


def healthy_rows(steps: int = 40, seed: int = 0) -> list[dict[str, Any]]:
    """A healthy run's step rows, as a calculator run with a small instruct model writes
    them (8 groups of 8 per step): reward and success rise together, entropy eases down,
    lengths drift a little, a few tool errors, staleness well under its bound of 2."""
    rng = np.random.default_rng(seed)
    rows, tool_errors = [], 0.0
    for step in range(1, steps + 1):
        p = step / steps
        reward = min(1.0, 0.35 + 0.5 * p + rng.normal(0, 0.04))
        tool_errors += float(rng.integers(0, 3))
        rows.append(
            {
                "step": step,
                "reward_mean": reward,
                "success_rate": reward,
                "entropy": 0.55 - 0.15 * p + rng.normal(0, 0.02),
                "response_tokens": 70 - 15 * p + rng.normal(0, 3),
                "turns_mean": 2.1 + rng.normal(0, 0.05),
                "single_turn_share": 0.15 + rng.normal(0, 0.03),
                "truncated_share": abs(rng.normal(0.02, 0.01)),
                "zero_variance_share": min(0.45, 0.1 + 0.3 * p + abs(rng.normal(0, 0.04))),
                "repeated_completion_share": abs(rng.normal(0.02, 0.02)),
                "ngram_repeat_share": abs(rng.normal(0.005, 0.005)),
                "kl": 0.002 + 0.0001 * step + abs(rng.normal(0, 0.0003)),
                "logprob_gap_fresh": 0.01 + rng.normal(0, 0.001),
                "clip_fraction": 0.02 + rng.normal(0, 0.004),
                "masked_fraction": 0.0,
                "staleness_mean": 0.5 + rng.normal(0, 0.1),
                "staleness_max": 1.0,
                "tool_results": 77.0 + float(rng.integers(-5, 6)),
                "errors/tool_errors/timeout": tool_errors,
            }
        )
    return rows
