"""Pure data that crosses module boundaries: trajectories, their spans, groups.

A :class:`Trajectory` is one token sequence with parallel arrays of equal length:

* ``token_ids``: exactly the ids the model saw and produced, never re-tokenized;
* ``logprobs``: the behaviour policy's logprob of each sampled token, NaN elsewhere;
* ``versions``: the policy version that sampled each token, -1 for prompt, env and
  tool tokens;
* ``loss_mask``: 1 on sampled tokens, 0 elsewhere.

Invariants are checked at construction; a violation raises ``ValueError`` naming the
offending lengths or positions. Arrays are numpy (int32/float32/int8), about 13 bytes
per token. No torch, no vLLM, no I/O here.

Two small values name things that used to be strings parsed back: a failed episode's
:class:`FailureKind` (carried next to its human-readable ``reason``), and the
:class:`RequestId` of one generation call (built and parsed here only).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import operator
from typing import Any, Literal

import numpy as np

EpisodeStatus = Literal["finished", "truncated", "failed"]
SpanKind = Literal["prompt", "assistant", "tool", "env"]
NO_VERSION = -1

Message = dict[str, Any]


class FailureKind(enum.StrEnum):
    """Why an episode failed (status ``failed``), as data; ``reason`` says it in words.

    The metrics count each kind as ``failures/<kind>``.
    """

    ENV_EXCEPTION = "env_exception"
    """The env raised in ``make``, ``reset``, ``step`` or ``set_state``."""
    ENV_TIMEOUT = "env_timeout"
    """An env call took longer than ``rollout.env_timeout_s``."""
    ENV_BAD_OBSERVATION = "env_bad_observation"
    """The env returned something that is not an observation (a str or chat messages)."""
    ENV_REPLAY = "env_replay"
    """Resuming by replaying the recorded actions did not reproduce the recorded
    observations (the env is not deterministic from its seed)."""
    ENV_UNAVAILABLE = "env_unavailable"
    """The env server running the episode died, refused it or dropped its session
    (``[env] url``/``urls``); the episode is retried on a fresh session elsewhere."""
    ENV_PROTOCOL = "env_protocol"
    """The env server answered with something that is not the OpenEnv protocol (not
    JSON, a missing field, a message of the wrong type)."""


_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
"""One encoder for every value: ``json.dumps`` with these arguments builds a new encoder
per call (0.8 us here, about what encoding a task's kwargs costs)."""


def dump_json(value: Any) -> str:
    """Compact JSON; NaN and infinity are refused (they are not JSON): ``ValueError``,
    and ``TypeError`` for what JSON cannot hold. The store's rows and the env-state check
    after every env step use it."""
    return _JSON.encode(value)


def _quick_pickle(cls: type) -> type:
    """Give a slots dataclass a cheaper pickle state: its field values as one tuple.

    ``dataclass(slots=True)`` pickles through ``__getstate__``/``__setstate__`` that call
    ``dataclasses.fields()`` for every object, both ways: a trajectory crossing from a
    rollout worker (:mod:`agentrl.rollout.workers`) carries one per token span. The
    state stays the values in field order, as there; unpickling sets them without
    ``__init__``, as there (no ``__post_init__``: the object was checked when made).
    Only that wire pickles them, with this version at both ends: nothing persisted is
    pickled (the store and trainer checkpoints are JSON and raw arrays).
    """
    names = tuple(f.name for f in dataclasses.fields(cls))
    values = operator.attrgetter(*names)
    setter = object.__setattr__  # frozen ones too

    def __getstate__(self: Any) -> Any:
        return values(self) if len(names) > 1 else (values(self),)

    def __setstate__(self: Any, state: Any) -> None:
        for name, value in zip(names, state, strict=True):
            setter(self, name, value)

    cls.__getstate__ = __getstate__  # type: ignore[attr-defined]
    cls.__setstate__ = __setstate__  # type: ignore[attr-defined]
    return cls


@_quick_pickle
@dataclasses.dataclass(frozen=True, slots=True)
class RequestId:
    """The id of one generation call: its episode and a number unique in the process.

    Written ``"<episode_id>-<serial>"``; the episode id may itself hold ``-``, the serial
    never does. The inference pool routes by :attr:`episode_id` (episode affinity), and
    a weight update finds the episodes it aborted through it.
    """

    episode_id: str
    serial: int

    def __post_init__(self) -> None:
        if not self.episode_id:
            raise ValueError(f"a request id needs an episode id, got {self.episode_id!r}")
        if self.serial < 0:
            raise ValueError(f"request id serial {self.serial} is negative")

    def format(self) -> str:
        return f"{self.episode_id}-{self.serial}"

    def __str__(self) -> str:
        return self.format()

    @classmethod
    def parse(cls, text: str) -> RequestId:
        """The inverse of :meth:`format`.

        Raises:
            ValueError: ``text`` was not made by :meth:`format`.
        """
        episode_id, sep, serial = text.rpartition("-")
        if not sep or not episode_id or not (serial.isascii() and serial.isdigit()):
            raise ValueError(f"{text!r} is not a request id of the form '<episode_id>-<serial>'")
        return cls(episode_id, int(serial))


@_quick_pickle
@dataclasses.dataclass(frozen=True, slots=True)
class TokenSpan:
    """A contiguous run of tokens in a trajectory: ``token_ids[start:end]``."""

    kind: SpanKind
    start: int
    end: int
    turn: int

    @property
    def sampled(self) -> bool:
        return self.kind == "assistant"

    def astuple(self) -> tuple[Any, ...]:
        """``dataclasses.astuple(self)``, without its generic recursion and deep copies
        (the fields are atoms): checkpoints and stored trajectories write every span."""
        return _span_fields(self)


@_quick_pickle
@dataclasses.dataclass(slots=True)
class Timings:
    """Seconds an episode spent in each place (wall clock, summed over turns)."""

    engine_wait_s: float = 0.0
    """Held at the admission gate (e.g. paused for a weight update) before generating."""
    generate_s: float = 0.0
    """Inside generation calls, queueing inside vLLM included."""
    tools_s: float = 0.0
    env_s: float = 0.0
    total_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        # dataclasses.asdict, without its deep copies (the fields are floats)
        return {name: getattr(self, name) for name in _TIMINGS_FIELDS}


_span_fields = operator.attrgetter(*(f.name for f in dataclasses.fields(TokenSpan)))
_TIMINGS_FIELDS = tuple(f.name for f in dataclasses.fields(Timings))


_NO_VERSION_BYTES = np.int32(NO_VERSION).tobytes()
_FLIP = bytes.maketrans(b"\x00\x01", b"\x01\x00")
"""Swaps the bytes 0 and 1: a 0/1 mask's bytes into its complement's."""


def _array(values: Any, dtype: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(values, dtype=dtype))


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
            lengths = {"token_ids": n, "logprobs": len(logprobs), "versions": len(versions),
                       "loss_mask": len(loss_mask)}  # fmt: skip
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
        expected = np.repeat(np.array([span.sampled for span in spans], np.int8),
                             [span.end - span.start for span in spans])  # fmt: skip
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


def failure_of(record: dict[str, Any], status: str) -> FailureKind | None:
    """The failure kind of a stored trajectory record (its JSON meta, or a JSONL line).

    Records written before the kind was a field spelled it as the prefix of their
    reason (``"env_timeout: ..."``); for them, and only here, the reason is parsed.
    """
    if "failure" in record:
        return None if record["failure"] is None else FailureKind(record["failure"])
    if status != "failed":
        return None
    prefix = str(record.get("reason", "")).split(":", 1)[0].strip()
    return FailureKind(prefix) if prefix in FailureKind._value2member_map_ else None


@_quick_pickle
@dataclasses.dataclass(frozen=True, slots=True)
class Task:
    """One unit of work: an env id plus the seed every episode of its group shares."""

    task_id: str
    env_id: str
    seed: int
    options: dict[str, Any] | None = None
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


@_quick_pickle
@dataclasses.dataclass(slots=True)
class Group:
    """The G episodes of one task: trained together once all of them have ended."""

    task: Task
    size: int
    trajectories: list[Trajectory] = dataclasses.field(default_factory=list)
    admitted_at: int | None = None
    """The trainer's version when the scheduler admitted the group (None: restored from
    the store after a restart, or not scheduled): a step at version ``u`` must train
    every group admitted at ``u - max_staleness`` or before."""

    @property
    def episodes(self) -> set[str]:
        return {t.episode_id for t in self.trajectories}

    @property
    def complete(self) -> bool:
        return len(self.episodes) == self.size

    @property
    def rewards(self) -> list[float]:
        """One reward per episode (segments of one episode share it)."""
        seen: dict[str, float] = {}
        for t in self.trajectories:
            seen.setdefault(t.episode_id, t.reward)
        return list(seen.values())

    def min_version(self) -> int:
        versions = [t.min_version() for t in self.trajectories if t.num_sampled]
        return min(versions) if versions else NO_VERSION

    def num_tokens(self) -> int:
        return sum(len(t) for t in self.trajectories)


@_quick_pickle
@dataclasses.dataclass(slots=True)
class SegmentArrays:
    """The token arrays of one segment of an unfinished episode."""

    token_ids: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    loss_mask: np.ndarray
    spans: list[TokenSpan]

    def __post_init__(self) -> None:
        self.token_ids = _array(self.token_ids, np.int32)
        self.logprobs = _array(self.logprobs, np.float32)
        self.versions = _array(self.versions, np.int32)
        self.loss_mask = _array(self.loss_mask, np.int8)


@_quick_pickle
@dataclasses.dataclass(slots=True)
class PartialEpisode:
    """An unfinished episode, exactly as far as it got: enough to continue it.

    Written to the store when a weight update pauses the episode and at turn boundaries
    (its first, then once per ``rollout.checkpoint_interval_s``); read back to resume
    after an update, after a crash, or to debug it.

    Attributes:
        version: the engine's policy version when the snapshot was taken.
        segments: the token arrays so far (the last one is being extended).
        turn: assistant turns completed.
        turn_sampled: tokens of the current, unfinished assistant turn already sampled
            (they end the last segment; 0 at a turn boundary).
        last_finish: how the last completed assistant turn ended.
        env_state: the env's ``get_state()`` when it has one, else None (then resume
            replays ``env_log``'s actions from the seed).
        turn_starts: for each assistant turn, where it started (``messages``,
            ``segment``, ``tokens``, ``env_steps``, ``rewards``, ``tool_calls``): the
            points a fork can branch at.
    """

    episode_id: str
    task: Task
    attempt: int
    version: int
    started_version: int
    segments: list[SegmentArrays]
    messages: list[Message]
    tools: list[dict[str, Any]] | None
    turn: int
    turn_sampled: int
    last_finish: str
    segments_started: int
    rewards: list[float]
    tool_calls: int
    env_state: dict[str, Any] | None
    env_log: list[dict[str, Any]]
    turn_starts: list[dict[str, int]]
    timings: Timings = dataclasses.field(default_factory=Timings)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def concatenated(self) -> dict[str, np.ndarray]:
        """All segments' arrays end to end (segment bounds are in :meth:`meta`)."""
        names = ("token_ids", "logprobs", "versions", "loss_mask")
        return {
            name: np.concatenate([getattr(s, name) for s in self.segments])
            if self.segments
            else np.zeros(0)
            for name in names
        }

    def meta(self) -> dict[str, Any]:
        """Everything but the arrays, as JSON-ready data."""
        bounds, position = [], 0
        for s in self.segments:
            bounds.append((position, position + len(s.token_ids), [x.astuple() for x in s.spans]))
            position += len(s.token_ids)
        return {
            "episode_id": self.episode_id,
            "task": _task_dict(self.task),
            "attempt": self.attempt,
            "version": self.version,
            "started_version": self.started_version,
            "segments": bounds,
            "messages": self.messages,
            "tools": self.tools,
            "turn": self.turn,
            "turn_sampled": self.turn_sampled,
            "last_finish": self.last_finish,
            "segments_started": self.segments_started,
            "rewards": self.rewards,
            "tool_calls": self.tool_calls,
            "env_state": self.env_state,
            "env_log": self.env_log,
            "turn_starts": self.turn_starts,
            "timings": self.timings.as_dict(),
            "info": self.info,
        }

    @property
    def num_sampled(self) -> int:
        return int(sum(int(s.loss_mask.sum()) for s in self.segments))

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments)


_ATOMS = (str, int, float, bool, type(None))


def _task_dict(task: Task) -> dict[str, Any]:
    """``dataclasses.asdict(task)``; the usual task (options and kwargs of plain values)
    without its generic recursion, which every checkpoint paid."""
    parts = (task.options or {}, task.env_kwargs)
    if not all(type(v) in _ATOMS for d in parts for v in d.values()):
        return dataclasses.asdict(task)
    return {"task_id": task.task_id, "env_id": task.env_id, "seed": task.seed,
            "options": None if task.options is None else dict(task.options),
            "env_kwargs": dict(task.env_kwargs)}  # fmt: skip
