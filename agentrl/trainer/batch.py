"""From complete groups to padded micro-batches of token tensors.

Each trainable trajectory (not failed, at least one sampled token) becomes one row.
Its advantage is its episode's reward relative to the other episodes of its group
(segments of one episode share it). Rows are padded on the right; position ``i`` of
the shifted tensors is the prediction of token ``i + 1`` from the tokens before it.
Micro-batches hold at most ``max_tokens`` padded tokens (and at least one row).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

from agentrl.trainer.losses import group_advantages
from agentrl.types import Group, Trajectory


@dataclasses.dataclass(slots=True)
class Row:
    trajectory: Trajectory
    advantage: float
    group: int


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

    @property
    def tokens(self) -> int:
        return int(self.mask.sum().item())

    def to(self, device: torch.device) -> MicroBatch:
        """The same batch on ``device`` (itself when it is there already)."""
        if self.input_ids.device == device:
            return self
        return MicroBatch(*(getattr(self, f.name).to(device) for f in dataclasses.fields(self)))


def rows_from_groups(
    groups: Sequence[Group], scale: Literal["group", "batch", "none"] = "group"
) -> list[Row]:
    """Trainable trajectories with their group-relative advantages."""
    episodes: list[tuple[int, str, float]] = []
    for gi, group in enumerate(groups):
        seen: set[str] = set()
        for t in group.trajectories:
            if t.episode_id not in seen and t.status != "failed":
                seen.add(t.episode_id)
                episodes.append((gi, t.episode_id, t.reward))
    if not episodes:
        return []
    adv = group_advantages(
        torch.tensor([r for _, _, r in episodes]),
        torch.tensor([g for g, _, _ in episodes]),
        scale,
    )
    by_episode = {(g, e): float(a) for (g, e, _), a in zip(episodes, adv.tolist(), strict=True)}
    rows = []
    for gi, group in enumerate(groups):
        for t in group.trajectories:
            if t.trainable and (gi, t.episode_id) in by_episode:
                rows.append(Row(t, by_episode[(gi, t.episode_id)], gi))
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
    for i, row in enumerate(rows):
        t = row.trajectory
        n = len(t)
        ids[i, :n] = t.token_ids
        attention[i, :n] = 1
        mask[i, :n] = t.loss_mask
        behaviour[i, :n] = np.nan_to_num(t.logprobs, nan=0.0)
        versions[i, :n] = t.versions
    return MicroBatch(
        input_ids=torch.from_numpy(ids),
        attention_mask=torch.from_numpy(attention),
        targets=torch.from_numpy(ids[:, 1:].copy()),
        mask=torch.from_numpy(mask[:, 1:].copy()),
        behaviour_logprobs=torch.from_numpy(behaviour[:, 1:].copy()),
        versions=torch.from_numpy(versions[:, 1:].copy()),
        advantages=torch.tensor([r.advantage for r in rows], dtype=torch.float32),
    )
