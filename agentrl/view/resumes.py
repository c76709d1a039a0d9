"""Where an episode resumed within one attempt, for the episode page's marks.

Two things pause an in-flight episode and resume it from its exact token prefix in the
same attempt, and the store keeps a trace of each:

* a weight publish (``rollout.update_policy = "resume"``): the episode parks, is
  checkpointed and re-submits its prefix under the new weights; the trace is in the
  versions per token: the first sampled token whose version differs from the sampled
  token before it. Inside an assistant turn that is where generation was aborted and
  resumed (``weight publish``); at a turn's first token the episode was between turns
  when the weights changed (``turn start``: parked at the gate, or not held at all);
* a crash: ``--resume`` continues the episode from its last checkpoint; the runner
  lists each such resume in the trajectory's ``info["resumed"]`` (segment, token
  position, turn, version at the checkpoint).

An unfinished episode's latest checkpoint (its ``partials`` row) is where a resume would
continue: marked at its end. In: the segments' arrays, ``info`` and whether the episode
is unfinished. Out: JSON-ready marks ``{segment, token, turn, before, after, why}``,
``token`` being the first token of the resumed part (the length, for a checkpoint).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from agentrl.types import SegmentArrays

Why = Literal["weight publish", "turn start", "checkpoint", "checkpointed"]


def resume_marks(
    segments: Sequence[SegmentArrays], info: Mapping[str, Any], *, unfinished: bool
) -> list[dict[str, Any]]:
    """Every resume of the attempt, in token order (see the module docstring)."""
    marks: dict[tuple[int, int], dict[str, Any]] = {}
    for index, seg in enumerate(segments):
        for token, before, after in _version_changes(seg):
            starts_turn = any(s.start == token for s in seg.spans)
            why: Why = "turn start" if starts_turn else "weight publish"
            marks[index, token] = _mark(seg, index, token, before, after, why)
    for at in info.get("resumed") or []:
        try:
            index, token = int(at["segment"]), int(at["token"])
            seg = segments[index]
        except (KeyError, TypeError, ValueError, IndexError):
            continue  # a record this version cannot place: no mark rather than a wrong one
        first = _first_sampled(seg, token)
        if first is not None and marks.get((index, first), {}).get("why") == "turn start":
            del marks[index, first]  # the version changed because it resumed here
        before = _sampled_version(seg, token, -1)
        after = _sampled_version(seg, token, +1)
        marks[index, token] = _mark(seg, index, token, before, after, "checkpoint")
        marks[index, token]["turn"] = int(at.get("turn", marks[index, token]["turn"]))
    if unfinished and segments:
        seg, index = segments[-1], len(segments) - 1
        end = len(seg.token_ids)
        marks[index, end] = _mark(
            seg, index, end, _sampled_version(seg, end, -1), None, "checkpointed"
        )
    return [marks[k] for k in sorted(marks)]


def _version_changes(seg: SegmentArrays) -> list[tuple[int, int, int]]:
    """(token, version before, version after) where the sampled tokens' version changes."""
    sampled = np.flatnonzero((np.asarray(seg.loss_mask) > 0) & (np.asarray(seg.versions) >= 0))
    if sampled.size < 2:
        return []
    versions = np.asarray(seg.versions)[sampled]
    changed = np.flatnonzero(versions[1:] != versions[:-1]) + 1
    return [(int(sampled[i]), int(versions[i - 1]), int(versions[i])) for i in changed]


def _first_sampled(seg: SegmentArrays, token: int) -> int | None:
    """The index of the first sampled token at or after ``token``."""
    mask = (np.asarray(seg.loss_mask) > 0) & (np.asarray(seg.versions) >= 0)
    where = np.flatnonzero(mask[token:])
    return token + int(where[0]) if where.size else None


def _sampled_version(seg: SegmentArrays, token: int, direction: int) -> int | None:
    """The version of the nearest sampled token before ``token`` (-1) or from it on (+1)."""
    if direction > 0:
        first = _first_sampled(seg, token)
        return None if first is None else int(seg.versions[first])
    mask = (np.asarray(seg.loss_mask) > 0) & (np.asarray(seg.versions) >= 0)
    where = np.flatnonzero(mask[:token])
    return int(seg.versions[int(where[-1])]) if where.size else None


def _mark(
    seg: SegmentArrays, index: int, token: int, before: int | None, after: int | None, why: Why
) -> dict[str, Any]:
    turn = next((s.turn for s in seg.spans if s.start <= token < s.end), None)
    if turn is None:  # at the very end: the last span's turn
        turn = seg.spans[-1].turn if seg.spans else 0
    return {
        "segment": index,
        "token": token,
        "turn": int(turn),
        "before": before,
        "after": after,
        "why": why,
    }
