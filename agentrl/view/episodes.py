"""One episode as the page shows it: transcript, tokens with their overlays, lineage.

In: a read-only :class:`~agentrl.store.EpisodeStore`, an episode id (and attempt), a
:class:`~agentrl.view.tokens.TokenText`. Out: a JSON-ready dict:

* ``messages``, ``turn_rewards``, ``env_log``: the transcript as recorded;
* ``segments``: each training segment's tokens as parallel arrays (``ids``,
  ``versions``, ``logprobs`` with None for NaN, ``mask``) and its spans
  (``[kind, start, end, turn]``), plus ``texts`` (the text of each distinct id);
* ``segments[i]["trainer"]``, for a trained segment of a run that keeps the trainer's
  record (:mod:`agentrl.trainer.tokenrecord`): its logprob, importance weight,
  advantage and correction mask per token;
* ``attempts``: every attempt of the episode (a crash or a retry makes more than one);
* ``lineage``: the episode it was resumed or forked from, the episodes derived from
  it, and for a fork the first assistant turn whose tokens differ from its parent's;
* ``resumes``: where the attempt paused and resumed from its exact prefix (a weight
  publish, a crash's checkpoint), :mod:`agentrl.view.resumes`'s marks.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from agentrl.errors import ConfigError
from agentrl.store import EpisodeStore, browse
from agentrl.trainer.tokenrecord import read_record
from agentrl.types import SegmentArrays
from agentrl.view.resumes import resume_marks
from agentrl.view.tokens import TokenText

_DERIVED = re.compile(r"^(?P<parent>.+)~(?:fork@(?P<turn>\d+)|resumed)-\d+$")


def episode_detail(
    store: EpisodeStore, episode_id: str, attempt: int | None, texts: TokenText
) -> dict[str, Any]:
    """The episode page's data (see the module docstring)."""
    tries = browse.attempts(store, episode_id)
    if not tries:
        raise ConfigError(f"no episode {episode_id!r} in {str(store.path)!r}")
    chosen = (
        tries[-1] if attempt is None else next((t for t in tries if t["attempt"] == attempt), None)
    )
    if chosen is None:
        raise ConfigError(
            f"episode {episode_id!r} has no attempt {attempt} (it has "
            f"{[t['attempt'] for t in tries]})"
        )
    recorded = _recorded(store, episode_id, chosen["attempt"])
    segments = [_segment(s) for s in recorded["segments"]]
    trained = read_record(store.path.parent, episode_id, chosen["attempt"])
    for index, segment in enumerate(segments):
        if index in trained:  # what the trainer computed for it, token by token
            segment["trainer"] = trained[index]
    ids = [i for s in recorded["segments"] for i in s.token_ids.tolist()]
    parent = _DERIVED.match(episode_id)
    return {
        "episode_id": episode_id,
        **chosen,
        "env_id": recorded["env_id"],
        "task_id": recorded["task_id"],
        "unfinished": recorded["unfinished"],
        "failure": recorded["failure"],
        "messages": recorded["messages"],
        "turn_rewards": recorded["turn_rewards"],
        "env_log": recorded["env_log"],
        "segments": segments,
        "texts": {str(k): v for k, v in texts.texts(ids).items()},
        "attempts": tries,
        "resumes": resume_marks(
            recorded["segments"], recorded["info"], unfinished=recorded["unfinished"]
        ),
        "lineage": {
            "parent": parent["parent"] if parent else None,
            "fork_turn": int(parent["turn"]) if parent and parent["turn"] else None,
            "derived": browse.derived(store, episode_id),
            "first_diff_turn": _first_diff(store, parent["parent"], recorded["segments"])
            if parent and parent["turn"]
            else None,
        },
    }


def _recorded(store: EpisodeStore, episode_id: str, attempt: int) -> dict[str, Any]:
    """An attempt as ended trajectories or, if unfinished, its latest checkpoint."""
    partial = store.partial(episode_id)
    if partial is not None and partial.attempt == attempt:
        return {
            "segments": partial.segments,
            "messages": partial.messages,
            "turn_rewards": partial.rewards,
            "env_log": partial.env_log,
            "env_id": partial.task.env_id,
            "task_id": partial.task.task_id,
            "unfinished": True,
            "failure": None,
            "info": partial.info,
        }
    trajectories = store.trajectories(episode_id, attempt)
    if not trajectories:
        return {
            "segments": [],
            "messages": [],
            "turn_rewards": [],
            "env_log": [],
            "env_id": None,
            "task_id": None,
            "unfinished": True,
            "failure": None,
            "info": {},
        }
    first = trajectories[0]
    return {
        "segments": [
            SegmentArrays(t.token_ids, t.logprobs, t.versions, t.loss_mask, list(t.spans))
            for t in trajectories
        ],
        "messages": trajectories[-1].messages,
        "turn_rewards": first.turn_rewards,
        "env_log": first.env_log,
        "env_id": first.env_id,
        "task_id": first.task_id,
        "unfinished": False,
        "failure": None if first.failure is None else first.failure.value,
        "info": first.info,
    }


def _segment(s: SegmentArrays) -> dict[str, Any]:
    logprobs = [None if math.isnan(x) else round(x, 4) for x in s.logprobs.tolist()]
    return {
        "ids": s.token_ids.tolist(),
        "versions": s.versions.tolist(),
        "logprobs": logprobs,
        "mask": s.loss_mask.tolist(),
        "spans": [[p.kind, p.start, p.end, p.turn] for p in s.spans],
    }


def assistant_turns(segments: list[SegmentArrays]) -> dict[int, list[int]]:
    """Each assistant turn's sampled token ids, by turn."""
    turns: dict[int, list[int]] = {}
    for s in segments:
        for span in s.spans:
            if span.kind == "assistant":
                turns.setdefault(span.turn, []).extend(s.token_ids[span.start : span.end].tolist())
    return turns


def _first_diff(store: EpisodeStore, parent_id: str, segments: list[SegmentArrays]) -> int | None:
    """The first assistant turn whose tokens differ between a fork and its parent."""
    tries = browse.attempts(store, parent_id)
    if not tries:
        return None
    parent = _recorded(store, parent_id, tries[-1]["attempt"])["segments"]
    mine, theirs = assistant_turns(segments), assistant_turns(parent)
    for turn in range(max([*mine, *theirs], default=-1) + 1):
        a, b = mine.get(turn), theirs.get(turn)
        if a is None or b is None or not np.array_equal(a, b):
            return turn
    return None
