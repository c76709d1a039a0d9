"""From complete groups to padded micro-batches of token tensors.

Each trainable trajectory (not failed, at least one sampled token) becomes one row.
Its advantage is its episode's reward relative to the other episodes of its group
(segments of one episode share it); with a per-turn scheme (``trainer.loss.advantage``
``turn_return`` or ``gigpo``, see :mod:`agentrl.trainer.advantages`) each assistant
turn's tokens get their turn's advantage instead. ``MicroBatch.advantages`` holds one
advantage per token either way. Rows are padded on the right; position ``i`` of the
shifted tensors is the prediction of token ``i + 1`` from the tokens before it.
Micro-batches hold at most ``max_tokens`` padded tokens (and at least one row).

:func:`packed_micro_batches` packs rows without padding instead: the model sees one
sequence of the rows' tokens side by side (:class:`Packed`: positions restarting per row
and the row offsets, for attention that stays within each row), while the per-token
tensors the loss reads (``targets``, ``mask``, ...) keep the padded ``(rows, T)`` layout,
so every loss and mask is computed exactly as for a padded batch; :attr:`Packed.index`
maps each of those positions to its place in the packed sequence. Rows go into
micro-batches of at most ``max_tokens`` tokens by first-fit decreasing (a row longer than
that gets a micro-batch of its own).
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
class Packed:
    """The model's view of a packed micro-batch: ``R`` rows in one sequence of ``N`` tokens."""

    input_ids: torch.Tensor
    """``(1, N)``: the rows' tokens one after the other."""
    position_ids: torch.Tensor
    """``(1, N)``: 0, 1, ... restarting at each row."""
    targets: torch.Tensor
    """``(1, N)``: the next token of the same row (the pad id at each row's last token)."""
    select: torch.Tensor
    """``(1, N)`` bool: the positions whose next token the loss covers."""
    cu_seqlens: torch.Tensor
    """``(R + 1,)`` int32: where each row starts, then ``N`` (varlen attention's offsets)."""
    max_len: int
    """The longest row."""
    index: torch.Tensor
    """``(R, T)``: the packed position of each shifted padded position (0 where invalid)."""
    valid: torch.Tensor
    """``(R, T)`` bool: the shifted padded positions inside their row."""

    def to(self, device: torch.device) -> Packed:
        return Packed(
            **{f.name: _to(getattr(self, f.name), device) for f in dataclasses.fields(self)}
        )


@dataclasses.dataclass(slots=True)
class MicroBatch:
    """Padded tensors of a few rows; ``*_shifted`` have one column less than ``input_ids``.

    With ``packed``, the model reads ``packed`` instead of ``input_ids`` and
    ``attention_mask``; the per-token tensors keep the padded layout either way.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    versions: torch.Tensor
    advantages: torch.Tensor
    """One advantage per (shifted) token."""
    packed: Packed | None = None
    """Set for a packed micro-batch (:func:`packed_micro_batches`)."""
    keys: tuple[tuple[str, int, int], ...] = ()
    """Each row's trajectory: ``(episode_id, attempt, segment)`` (for the token record)."""

    @property
    def tokens(self) -> int:
        return int(self.mask.sum().item())

    @property
    def model_tokens(self) -> int:
        """Tokens the model runs over: the rows' own (packed) or padded ones."""
        if self.packed is not None:
            return int(self.packed.input_ids.shape[1])
        return int(self.input_ids.numel())

    def to(self, device: torch.device) -> MicroBatch:
        """The same batch on ``device`` (itself when it is there already)."""
        if self.input_ids.device == device:
            return self
        return MicroBatch(
            **{f.name: _to(getattr(self, f.name), device) for f in dataclasses.fields(self)}
        )


def _to(value: object, device: torch.device) -> object:
    if isinstance(value, (torch.Tensor, Packed)):
        return value.to(device)
    return value


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
        values = turn_advantages(
            turns, loss.advantage, scale, gamma=loss.gamma, step_weight=loss.step_weight
        )
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
        keys=tuple(_key(r.trajectory) for r in rows),
    )


def _key(t: Trajectory) -> tuple[str, int, int]:
    return t.episode_id, t.attempt, t.segment


def packed_micro_batches(rows: Sequence[Row], max_tokens: int, pad_id: int = 0) -> list[MicroBatch]:
    """Pack rows without padding into micro-batches of at most ``max_tokens`` tokens.

    First-fit decreasing: longest rows first, each into the first micro-batch it fits
    (a row longer than ``max_tokens`` alone). Within a micro-batch rows keep their order.
    """
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i].trajectory))
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        n = len(rows[i].trajectory)
        for b, load in enumerate(loads):
            if load + n <= max_tokens:
                bins[b].append(i)
                loads[b] += n
                break
        else:
            bins.append([i])
            loads.append(n)
    return [pack([rows[i] for i in sorted(b)], pad_id) for b in bins]


def pack(rows: list[Row], pad_id: int = 0) -> MicroBatch:
    """One packed micro-batch of ``rows`` (the padded per-token tensors, plus :class:`Packed`)."""
    mb = _pad(rows, pad_id)
    lengths = np.array([len(r.trajectory) for r in rows], dtype=np.int64)
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    total = int(lengths.sum())
    ids = np.concatenate([np.asarray(r.trajectory.token_ids, dtype=np.int64) for r in rows])
    positions = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths])
    targets = np.full(total, pad_id, dtype=np.int64)
    targets[:-1] = ids[1:]
    targets[starts + lengths - 1] = pad_id  # a row's last token predicts nothing
    columns = mb.targets.shape[1]
    t = np.arange(columns, dtype=np.int64)[None, :]
    valid = t < (lengths[:, None] - 1)
    index = np.where(valid, starts[:, None] + t, 0)
    select = np.zeros(total, dtype=bool)
    on = valid & (mb.mask.numpy() > 0)
    select[index[on]] = True
    mb.packed = Packed(
        input_ids=torch.from_numpy(ids[None, :]),
        position_ids=torch.from_numpy(positions[None, :]),
        targets=torch.from_numpy(targets[None, :]),
        select=torch.from_numpy(select[None, :]),
        cu_seqlens=torch.from_numpy(np.r_[0, np.cumsum(lengths)].astype(np.int32)),
        max_len=int(lengths.max()),
        index=torch.from_numpy(index),
        valid=torch.from_numpy(valid),
    )
    return mb
