"""Credit per assistant turn: the advantage each turn's tokens get (``trainer.loss.advantage``).

An episode's assistant turns are numbered 0, 1, ... in the order they were sampled;
``TokenSpan.turn`` of an ``assistant`` span says which turn its tokens belong to (an
episode split into segments keeps the numbering across them), and
``Trajectory.turn_rewards[k]`` is the reward the env gave after turn ``k`` (0 after a
tool turn; a turn the episode ended in before the env answered has none and counts 0).
The episode's reward is their sum.

Schemes:

* ``episode`` (GRPO): every token of the episode gets its episode advantage, the reward
  relative to the other episodes of its group (:func:`~agentrl.trainer.losses.group_advantages`);
* ``turn_return``: turn ``k`` gets its discounted return
  ``G_k = sum_{j >= k} gamma^(j - k) r_j`` relative to the returns of every turn of
  every episode of its group (one pool per group, scaled like the episode advantage);
* ``gigpo`` (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent
  Training", arXiv 2505.10978, eq. 8): ``A = A_episode + step_weight * A_step``, where
  ``A_step`` is ``G_k`` relative to the returns of the turns of the same group that saw
  the same state: a *step group*. A turn alone in its step group gets ``A_step = 0``.

Which turns share a state (``step_key``): ``observation`` (GiGPO's anchor states) keys a
turn on the messages the env or tools sent right before it (for turn 0, the prompt
messages); ``prefix`` keys it on every token before it, so only turns with identical
histories meet. Values in, values out: no model, no I/O.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Hashable, Sequence
from typing import Literal

import numpy as np
import torch

from agentrl.config.sections import AdvantageScheme, StepKey
from agentrl.trainer.losses import group_advantages
from agentrl.types import Message, Trajectory

Scale = Literal["group", "batch", "none"]


@dataclasses.dataclass(frozen=True, slots=True)
class EpisodeTurns:
    """One episode as its advantage schemes see it: its group, rewards and turn keys."""

    group: int
    """Index of the episode's group in the step."""
    reward: float
    """The episode's reward."""
    turn_rewards: tuple[float, ...]
    """One reward per assistant turn (0 where the env gave none)."""
    keys: tuple[Hashable, ...]
    """One step-group key per assistant turn (turns of one group with equal keys saw
    the same state)."""

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.turn_rewards):
            raise ValueError(
                f"{len(self.turn_rewards)} turn rewards but {len(self.keys)} turn keys"
            )


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """``G_k = r_k + gamma * G_(k+1)``, from the last turn back (GiGPO eq. 5)."""
    out = [0.0] * len(rewards)
    running = 0.0
    for k in range(len(rewards) - 1, -1, -1):
        running = float(rewards[k]) + gamma * running
        out[k] = running
    return out


def _observation_chunks(messages: Sequence[Message]) -> list[str]:
    """What came before each assistant message: chunk ``k`` is the messages between
    assistant message ``k - 1`` and ``k`` (chunk 0: the prompt), as JSON text."""
    chunks: list[list[Message]] = [[]]
    for message in messages:
        if message.get("role") == "assistant":
            chunks.append([])
        else:
            chunks[-1].append(message)
    return [json.dumps(c, sort_keys=True, default=str) for c in chunks]


def episode_turns(group: int, segments: Sequence[Trajectory], step_key: StepKey) -> EpisodeTurns:
    """The turns of one episode (its segments, in order), keyed as ``step_key`` says.

    Raises:
        ValueError: a segment has sampled tokens but no token spans to find turns in.
    """
    first = segments[0]
    prefixes: dict[int, bytes] = {}
    for seg in segments:
        if seg.num_sampled and not seg.spans:
            raise ValueError(
                f"trajectory {seg.episode_id!r} (segment {seg.segment}) has no token spans; "
                f"per-turn advantages need them"
            )
        for span in seg.spans:
            if span.sampled and span.turn not in prefixes:
                prefixes[span.turn] = seg.token_ids[: span.start].tobytes()
    n = max(len(first.turn_rewards), max(prefixes, default=-1) + 1)
    rewards = tuple(list(map(float, first.turn_rewards)) + [0.0] * (n - len(first.turn_rewards)))
    chunks = _observation_chunks(first.messages)
    keys: list[Hashable] = []
    for k in range(n):
        if step_key == "prefix" and k in prefixes:
            keys.append(("prefix", prefixes[k]))
        elif step_key == "observation" and k < len(chunks):
            keys.append(("observation", chunks[k]))
        else:  # nothing to match it on: a step group of its own
            keys.append(("alone", first.episode_id, k))
    return EpisodeTurns(group, float(first.reward), rewards, tuple(keys))


def _ids(labels: Sequence[Hashable]) -> torch.Tensor:
    """Labels as integer group ids (equal labels, equal ids)."""
    index: dict[Hashable, int] = {}
    return torch.tensor([index.setdefault(label, len(index)) for label in labels])


def turn_advantages(
    episodes: Sequence[EpisodeTurns],
    scheme: AdvantageScheme,
    scale: Scale,
    *,
    gamma: float,
    step_weight: float,
) -> list[tuple[float, ...]]:
    """Each episode's advantage per turn under ``scheme`` (see the module docstring).

    ``scale`` (``trainer.scale_rewards``) scales every comparison the same way: by the
    std of the values compared (``group``), of all values of that kind in the batch
    (``batch``), or not (``none``).
    """
    if not episodes:
        return []
    counts = [len(e.turn_rewards) for e in episodes]
    episode_adv = group_advantages(
        torch.tensor([e.reward for e in episodes]), torch.tensor([e.group for e in episodes]), scale
    ).tolist()
    if scheme == "episode":
        per_turn = [[a] * n for a, n in zip(episode_adv, counts, strict=True)]
    else:
        returns = torch.tensor(
            [g for e in episodes for g in discounted_returns(e.turn_rewards, gamma)],
            dtype=torch.float64,
        )
        if returns.numel() == 0:
            return [() for _ in episodes]
        if scheme == "turn_return":
            groups = torch.tensor([e.group for e in episodes for _ in e.turn_rewards])
            flat = group_advantages(returns, groups, scale).tolist()
        elif scheme == "gigpo":
            steps = _ids([(e.group, key) for e in episodes for key in e.keys])
            step_adv = group_advantages(returns, steps, scale).tolist()
            base = [a for a, n in zip(episode_adv, counts, strict=True) for _ in range(n)]
            flat = [b + step_weight * s for b, s in zip(base, step_adv, strict=True)]
        else:
            raise ValueError(f"unknown advantage scheme {scheme!r}")
        per_turn, start = [], 0
        for n in counts:
            per_turn.append(flat[start : start + n])
            start += n
    return [tuple(float(a) for a in turns) for turns in per_turn]


def token_advantages(trajectory: Trajectory, per_turn: Sequence[float]) -> np.ndarray:
    """One advantage per token of ``trajectory``: each assistant span gets its turn's
    (0 on every other token, which the loss mask leaves out anyway)."""
    out = np.zeros(len(trajectory), dtype=np.float32)
    for span in trajectory.spans:
        if span.sampled:
            if span.turn >= len(per_turn):
                raise ValueError(
                    f"trajectory {trajectory.episode_id!r}: span {span} has no turn advantage "
                    f"({len(per_turn)} turns)"
                )
            out[span.start : span.end] = per_turn[span.turn]
    return out
