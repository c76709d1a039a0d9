"""``Trajectory``: one token sequence with parallel per-token arrays of equal length.

See :mod:`agentrl.types` for the arrays and their invariants; checked at construction,
a violation raises ``ValueError`` naming the offending lengths or positions.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from agentrl.types.values import (
    NO_VERSION,
    EpisodeStatus,
    FailureKind,
    Message,
    Timings,
    TokenSpan,
    _array,
    _quick_pickle,
    failure_of,
)

_NO_VERSION_BYTES = np.int32(NO_VERSION).tobytes()
_FLIP = bytes.maketrans(b"\x00\x01", b"\x01\x00")
"""Swaps the bytes 0 and 1: a 0/1 mask's bytes into its complement's."""


@_quick_pickle
@dataclasses.dataclass(eq=False, slots=True, weakref_slot=True)
class Trajectory:
    """One episode (or one training segment of it) as tokens plus what happened.

    An episode whose chat template is not prefix preserving is split into segments,
    each a Trajectory with the same ``episode_id`` and increasing ``segment``.
    """

    episode_id: str
    task_id: str
    env_id: str
    seed: int | None
    token_ids: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    loss_mask: np.ndarray
    spans: tuple[TokenSpan, ...]
    messages: list[Message]
    turn_rewards: list[float]
    reward: float
    status: EpisodeStatus
    reason: str = ""
    """Why it ended, in words, for people (shown, never parsed)."""
    failure: FailureKind | None = None
    """Why it failed, as data: set exactly when ``status`` is ``failed`` and the kind is
    known (None on failed records written before the kind was recorded)."""
    segment: int = 0
    attempt: int = 0
    timings: Timings = dataclasses.field(default_factory=Timings)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    env_log: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """What the env saw and said, for replay: ``{"action": text}`` per env step with the
    observation messages, reward and end flags it returned (the first entry is the
    reset: ``{"obs": messages}``)."""
    turn_starts: list[dict[str, int]] = dataclasses.field(default_factory=list)
    """Where each assistant turn started (see :class:`PartialEpisode`): fork points."""

    def __post_init__(self) -> None:
        self.token_ids = _array(self.token_ids, np.int32)
        self.logprobs = _array(self.logprobs, np.float32)
        self.versions = _array(self.versions, np.int32)
        self.loss_mask = _array(self.loss_mask, np.int8)
        self.spans = tuple(self.spans)
        if self.failure is not None:
            self.failure = FailureKind(self.failure)
        self.validate()

    def validate(self) -> None:
        """Check every invariant; raise ValueError naming what is wrong.

        Every trajectory is checked as it is made, so the usual one is proven valid in a
        few whole-array operations (:meth:`_plainly_valid`); any other goes through
        :meth:`_check_each_invariant`, which names what is wrong.
        """
        if not self._plainly_valid():
            self._check_each_invariant()

    def _check_each_invariant(self) -> None:
        """:meth:`validate`'s checks one by one (a few array operations each, the slower
        ones only to say what is wrong)."""
        who = f"trajectory {self.episode_id!r}"
        loss_mask, versions, logprobs = self.loss_mask, self.versions, self.logprobs
        n = len(self.token_ids)
        if not n == len(logprobs) == len(versions) == len(loss_mask):
            lengths = {
                "token_ids": n,
                "logprobs": len(logprobs),
                "versions": len(versions),
                "loss_mask": len(loss_mask),
            }
            raise ValueError(f"{who}: parallel arrays differ in length: {lengths}")
        if self.status not in ("finished", "truncated", "failed"):
            raise ValueError(f"{who}: status {self.status!r} is not finished/truncated/failed")
        if self.failure is not None and self.status != "failed":
            raise ValueError(f"{who}: status {self.status!r} with failure kind {self.failure!r}")
        if not math.isfinite(self.reward):
            raise ValueError(f"{who}: reward {self.reward} is not finite")
        if loss_mask.dtype == np.int8:  # 0 and 1 are the only int8s read as bytes <= 1
            not_binary = (loss_mask.view(np.uint8) > 1).any()
        else:
            not_binary = not ((loss_mask == 0) | (loss_mask == 1)).all()
        if not_binary:
            raise ValueError(f"{who}: loss_mask holds values other than 0 and 1")
        mask = loss_mask.astype(bool)
        rest = ~mask
        sampled_versions = versions[mask]
        # Non-decreasing from a first version >= 0 is all >= 0: one check for both.
        decreasing = sampled_versions.size > 0 and (np.diff(sampled_versions) < 0).any()
        if sampled_versions.size and (sampled_versions[0] < 0 or decreasing):
            if (sampled_versions < 0).any():
                bad = np.flatnonzero(mask & (versions < 0))[:5].tolist()
                raise ValueError(f"{who}: sampled tokens at {bad} have no policy version")
        if (versions[rest] != NO_VERSION).any():
            bad = np.flatnonzero(rest & (versions != NO_VERSION))[:5].tolist()
            raise ValueError(f"{who}: non-sampled tokens at {bad} carry a version (expected -1)")
        if decreasing:
            i = int(np.flatnonzero(np.diff(sampled_versions) < 0)[0])
            raise ValueError(
                f"{who}: versions decrease along the trajectory ({sampled_versions[i]} then "
                f"{sampled_versions[i + 1]})"
            )
        if not (logprobs[mask] <= 1e-4).all():  # False for NaN too
            raise ValueError(f"{who}: a sampled token has a NaN or positive logprob")
        if not np.isnan(logprobs[rest]).all():
            raise ValueError(f"{who}: a non-sampled token has a logprob (expected NaN)")
        spans = self.spans
        if not spans:
            return
        position = 0
        for span in spans:
            if span.start != position or span.end < span.start:
                raise ValueError(
                    f"{who}: span {span} does not start where the previous ended ({position})"
                )
            position = span.end
        expected = np.repeat(
            np.array([span.sampled for span in spans], np.int8),
            [span.end - span.start for span in spans],
        )
        if not np.array_equal(expected, loss_mask[:position]):  # or spans past the end
            wrong = [s for s in spans if (loss_mask[s.start : s.end] != int(s.sampled)).any()]
            if wrong:
                raise ValueError(f"{who}: span {wrong[0]} disagrees with loss_mask")
        if position != n:
            raise ValueError(f"{who}: spans cover {position} tokens of {n}")

    def _plainly_valid(self) -> bool:
        """True only when every invariant :meth:`validate` checks holds, proven in a few
        whole-array operations for the usual trajectory: spans laid end to end, and every
        sampled token of one policy version. The spans are written out as the bytes the
        loss mask, the versions and the logprobs' NaN flags must then be, and compared
        with them. False where that does not prove it (several versions, no spans, a
        defect): :meth:`_check_each_invariant` then decides, and names what is wrong.
        (On the rollout loop, an episode of 3 turns: 11 us against 27 for those checks.)"""
        loss_mask, versions, logprobs = self.loss_mask, self.versions, self.logprobs
        spans, n = self.spans, len(self.token_ids)
        if (
            not spans
            or not n == len(logprobs) == len(versions) == len(loss_mask)
            or loss_mask.dtype != np.int8
            or versions.dtype != np.int32
            or logprobs.dtype != np.float32
            or self.status not in ("finished", "truncated", "failed")
            or (self.failure is not None and self.status != "failed")
            or not math.isfinite(self.reward)
        ):
            return False
        newest = int(versions.max())
        if newest < 0:  # nothing sampled (or a defect): not the usual case
            return False
        sampled_version = np.int32(newest).tobytes()
        mask, labels = [], []
        position = 0
        for span in spans:
            start, end = span.start, span.end
            if start != position or end < start:
                return False
            if span.sampled:
                mask.append(b"\x01" * (end - start))
                labels.append(sampled_version * (end - start))
            else:
                mask.append(b"\x00" * (end - start))
                labels.append(_NO_VERSION_BYTES * (end - start))
            position = end
        expected = b"".join(mask)
        return (
            loss_mask.tobytes() == expected  # of n bytes: so the spans end at n
            and versions.tobytes() == b"".join(labels)
            # NaN exactly where nothing was sampled: the mask's bytes, flipped
            and np.isnan(logprobs).tobytes() == expected.translate(_FLIP)
            # the largest sampled logprob (fmax passes over NaN; all NaN gives NaN: False)
            and bool(np.fmax.reduce(logprobs) <= 1e-4)
        )

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_sampled(self) -> int:
        return int(self.loss_mask.sum())

    @property
    def trainable(self) -> bool:
        return self.status != "failed" and self.num_sampled > 0

    def span_tokens(self, span: TokenSpan) -> list[int]:
        return self.token_ids[span.start : span.end].tolist()

    def min_version(self) -> int:
        """The oldest version among the sampled tokens (-1 if none were sampled)."""
        sampled = self.versions[self.loss_mask.astype(bool)]
        return int(sampled.min()) if len(sampled) else NO_VERSION

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.token_ids, self.logprobs, self.versions, self.loss_mask))

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (lists for arrays; NaN logprobs become null)."""
        return {
            "episode_id": self.episode_id,
            "task_id": self.task_id,
            "env_id": self.env_id,
            "seed": self.seed,
            "segment": self.segment,
            "attempt": self.attempt,
            "status": self.status,
            "reason": self.reason,
            "failure": None if self.failure is None else self.failure.value,
            "reward": self.reward,
            "turn_rewards": self.turn_rewards,
            "token_ids": self.token_ids.tolist(),
            "logprobs": [None if math.isnan(x) else x for x in self.logprobs.tolist()],
            "versions": self.versions.tolist(),
            "loss_mask": self.loss_mask.tolist(),
            "spans": [dataclasses.asdict(s) for s in self.spans],
            "messages": self.messages,
            "timings": self.timings.as_dict(),
            "info": self.info,
            "env_log": self.env_log,
            "turn_starts": self.turn_starts,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Trajectory:
        return cls(
            episode_id=data["episode_id"],
            task_id=data["task_id"],
            env_id=data["env_id"],
            seed=data["seed"],
            token_ids=data["token_ids"],
            logprobs=[math.nan if x is None else x for x in data["logprobs"]],
            versions=data["versions"],
            loss_mask=data["loss_mask"],
            spans=tuple(TokenSpan(**s) for s in data["spans"]),
            messages=data["messages"],
            turn_rewards=data["turn_rewards"],
            reward=data["reward"],
            status=data["status"],
            reason=data.get("reason", ""),
            failure=failure_of(data, data["status"]),
            segment=data.get("segment", 0),
            attempt=data.get("attempt", 0),
            timings=Timings(**data.get("timings", {})),
            info=data.get("info", {}),
            env_log=data.get("env_log", []),
            turn_starts=data.get("turn_starts", []),
        )
