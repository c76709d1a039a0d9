"""The small values of the ground floor: failure kinds, request ids, token spans, timings.

Names for things that used to be strings parsed back: a failed episode's
:class:`FailureKind` (carried next to its human-readable ``reason``, and
:func:`failure_of` reading it from a stored record), and the :class:`RequestId` of one
generation call (built and parsed here only). Also :class:`TokenSpan` and
:class:`Timings`, the parts of a trajectory, the one compact JSON encoder
(:func:`dump_json`) and the cheap pickle state every value here and in
:mod:`agentrl.types.trajectory` / :mod:`agentrl.types.episode` uses on the worker wire.
"""

from __future__ import annotations

import dataclasses
import enum
import json
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


def _array(values: Any, dtype: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(values, dtype=dtype))


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
