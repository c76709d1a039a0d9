"""From complete groups to padded micro-batches of token tensors.

Each trainable trajectory (not failed, at least one sampled token) becomes one row.
Its advantage is its episode's reward relative to the other episodes of its group
(segments of one episode share it); with a per-turn scheme (``trainer.loss.advantage``
``turn_return`` or ``gigpo``, see :mod:`agentrl.trainer.advantages`) each assistant
turn's tokens get their turn's advantage instead. ``MicroBatch.advantages`` holds one
advantage per token either way. Rows are padded on the right; position ``i`` of the
shifted tensors is the prediction of token ``i + 1`` from the tokens before it.
Micro-batches hold at most ``max_tokens`` padded tokens (and at least one row).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

from agentrl.config import LossConfig
from agentrl.trainer.advantages import episode_turns, token_advantages, turn_advantages
from agentrl.trainer.losses import group_advantages
from agentrl.types import Group, Trajectory


@dataclasses.dataclass(slots=True)
class Row:
    trajectory: Trajectory
    advantage: float
    """The episode advantage (every token's, unless ``turn_advantages`` is set)."""
    group: int
    turn_advantages: tuple[float, ...] | None = None
    """Per-turn schemes: the advantage of each assistant turn of the episode."""

    def token_advantages(self) -> np.ndarray:
        """One advantage per token of the trajectory."""
        if self.turn_advantages is None:
            return np.full(len(self.trajectory), self.advantage, dtype=np.float32)
        return token_advantages(self.trajectory, self.turn_advantages)


@dataclasses.dataclass(slots=True)
class MicroBatch:
    """Padded tensors of a few rows; ``*_shifted`` have one column less than ``input_ids``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    versions: torch.Tensor
    advantages: torch.Tensor
    """One advantage per (shifted) token."""

    @property
    def tokens(self) -> int:
        return int(self.mask.sum().item())

    def to(self, device: torch.device) -> MicroBatch:
        """The same batch on ``device`` (itself when it is there already)."""
        if self.input_ids.device == device:
            return self
        return MicroBatch(*(getattr(self, f.name).to(device) for f in dataclasses.fields(self)))


def rows_from_groups(
    groups: Sequence[Group],
    scale: Literal["group", "batch", "none"] = "group",
    loss: LossConfig | None = None,
) -> list[Row]:
    """Trainable trajectories with their group-relative advantages.

    ``loss`` (default: ``LossConfig()``) says the advantage scheme and its settings
    (``advantage``, ``gamma``, ``step_weight``, ``step_key``).
    """
    loss = loss or LossConfig()
    segments: dict[tuple[int, str], list[Trajectory]] = {}
    for gi, group in enumerate(groups):
        for t in group.trajectories:
            if t.status != "failed":
                segments.setdefault((gi, t.episode_id), []).append(t)
    if not segments:
        return []
    episodes = list(segments)
    adv = group_advantages(
        torch.tensor([segments[e][0].reward for e in episodes]),
        torch.tensor([g for g, _ in episodes]),
        scale,
    )
    by_episode = {e: float(a) for e, a in zip(episodes, adv.tolist(), strict=True)}
    per_turn: dict[tuple[int, str], tuple[float, ...]] = {}
    if loss.advantage != "episode":
        turns = [episode_turns(g, segments[(g, e)], loss.step_key) for g, e in episodes]
        values = turn_advantages(turns, loss.advantage, scale, gamma=loss.gamma,
                                 step_weight=loss.step_weight)  # fmt: skip
        per_turn = dict(zip(episodes, values, strict=True))
    rows = []
    for gi, group in enumerate(groups):
        for t in group.trajectories:
            key = (gi, t.episode_id)
            if t.trainable and key in by_episode:
                rows.append(Row(t, by_episode[key], gi, per_turn.get(key)))
    return rows


def micro_batches(rows: Sequence[Row], max_tokens: int, pad_id: int = 0) -> list[MicroBatch]:
    """Pack rows (in order) into padded micro-batches of at most ``max_tokens`` tokens."""
    batches: list[list[Row]] = []
    current: list[Row] = []
    longest = 0
    for row in rows:
        n = len(row.trajectory)
        if current and max(longest, n) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(row)
        longest = max(longest, n)
    if current:
        batches.append(current)
    return [_pad(b, pad_id) for b in batches]


def _pad(rows: list[Row], pad_id: int) -> MicroBatch:
    length = max(len(r.trajectory) for r in rows)
    b = len(rows)
    ids = np.full((b, length), pad_id, dtype=np.int64)
    attention = np.zeros((b, length), dtype=np.int64)
    mask = np.zeros((b, length), dtype=np.float32)
    behaviour = np.zeros((b, length), dtype=np.float32)
    versions = np.full((b, length), -1, dtype=np.int64)
    advantages = np.zeros((b, length), dtype=np.float32)
    for i, row in enumerate(rows):
        t = row.trajectory
        n = len(t)
        ids[i, :n] = t.token_ids
        attention[i, :n] = 1
        mask[i, :n] = t.loss_mask
        behaviour[i, :n] = np.nan_to_num(t.logprobs, nan=0.0)
        versions[i, :n] = t.versions
        advantages[i, :n] = row.token_advantages()
    return MicroBatch(
        input_ids=torch.from_numpy(ids),
        attention_mask=torch.from_numpy(attention),
        targets=torch.from_numpy(ids[:, 1:].copy()),
        mask=torch.from_numpy(mask[:, 1:].copy()),
        behaviour_logprobs=torch.from_numpy(behaviour[:, 1:].copy()),
        versions=torch.from_numpy(versions[:, 1:].copy()),
        advantages=torch.from_numpy(advantages[:, 1:].copy()),
    )
