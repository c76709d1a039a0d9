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

The values live in three modules, all importable from here: :mod:`agentrl.types.values`
(failure kinds, request ids, token spans, timings, JSON), :mod:`agentrl.types.trajectory`
and :mod:`agentrl.types.episode` (tasks, groups, unfinished episodes).
"""

from agentrl.types.episode import Group, PartialEpisode, SegmentArrays, Task
from agentrl.types.trajectory import Trajectory
from agentrl.types.values import (
    NO_VERSION,
    EpisodeStatus,
    FailureKind,
    Message,
    RequestId,
    SpanKind,
    Timings,
    TokenSpan,
    dump_json,
    failure_of,
)

__all__ = [
    "NO_VERSION",
    "EpisodeStatus",
    "FailureKind",
    "Group",
    "Message",
    "PartialEpisode",
    "RequestId",
    "SegmentArrays",
    "SpanKind",
    "Task",
    "Timings",
    "TokenSpan",
    "Trajectory",
    "dump_json",
    "failure_of",
]
