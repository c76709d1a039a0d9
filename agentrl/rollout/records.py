"""What an episode's state becomes: a checkpoint, a trajectory, a turn's start marks.

Functions of an :class:`~agentrl.rollout.episode.EpisodeState` (no runner, no engine):
:func:`snapshot_of` (a :class:`~agentrl.types.PartialEpisode`, what a checkpoint and a
parked episode hold), :func:`trajectory_of` (one template segment as a
:class:`~agentrl.types.Trajectory`), :func:`turn_start` and
:func:`oldest_sampled_version`. The runner (:mod:`agentrl.rollout.runner`) decides when.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agentrl.chat import Conversation
from agentrl.rollout.envside import current_state, info_of
from agentrl.rollout.episode import EpisodeState
from agentrl.types import EpisodeStatus, FailureKind, PartialEpisode, Trajectory


def oldest_sampled_version(conversation: Conversation | None) -> int | None:
    """The policy version of a conversation's oldest sampled token (None: none yet)."""
    if conversation is None:
        return None
    versions = [
        int(v)
        for seg in conversation.segments
        for v, m in zip(seg.versions, seg.loss_mask, strict=True)
        if m
    ]
    return min(versions) if versions else None


def turn_start(ep: EpisodeState) -> dict[str, int]:
    """Where the turn that starts now begins in each of the episode's records."""
    conv = ep.conversation
    assert conv is not None
    return {
        "messages": len(conv.messages),
        "segment": len(conv.segments) - 1,
        "tokens": len(conv),
        "env_steps": len(ep.env_log) - 1,
        "rewards": len(ep.rewards),
        "tool_calls": ep.tool_calls,
    }


def snapshot_of(ep: EpisodeState, version: int) -> PartialEpisode:
    """The episode as a checkpoint (``version``: the engine's version now)."""
    conv = ep.conversation
    handle = ep.handle
    assert conv is not None and handle is not None
    return PartialEpisode(
        episode_id=ep.episode_id,
        task=ep.task,
        attempt=ep.attempt,
        version=version,
        started_version=ep.started_version,
        segments=[s.arrays() for s in conv.segments],
        messages=[dict(m) for m in conv.messages],
        tools=conv.tools,
        turn=conv.turn,
        turn_sampled=len(ep.pending),
        last_finish=conv.last_finish,
        segments_started=conv.segments_started,
        rewards=list(ep.rewards),
        tool_calls=ep.tool_calls,
        env_state=current_state(ep.env_log, handle),
        env_log=[dict(e) for e in ep.env_log],
        turn_starts=[dict(t) for t in ep.turn_starts],
        timings=dataclasses.replace(ep.timings),
        info=info_of(ep),
    )


def trajectory_of(
    ep: EpisodeState,
    conversation: Conversation | None,
    index: int,
    status: EpisodeStatus,
    reason: str,
    failure: FailureKind | None,
) -> Trajectory:
    """Segment ``index`` of the episode's conversation as a trajectory (None: no render)."""
    if conversation is None:
        arrays: dict[str, Any] = dict(
            token_ids=[], logprobs=[], versions=[], loss_mask=[], spans=()
        )
        messages: list[dict[str, Any]] = []
    else:
        seg = conversation.segments[index]
        arrays = dict(
            token_ids=seg.token_ids,
            logprobs=seg.logprobs,
            versions=seg.versions,
            loss_mask=seg.loss_mask,
            spans=tuple(seg.spans),
        )
        messages = conversation.messages
    return Trajectory(
        episode_id=ep.episode_id,
        task_id=ep.task.task_id,
        env_id=ep.task.env_id,
        seed=ep.task.seed,
        messages=messages,
        turn_rewards=list(ep.rewards),
        reward=float(sum(ep.rewards)),
        status=status,
        reason=reason,
        failure=failure,
        segment=index,
        attempt=ep.attempt,
        timings=ep.timings,
        info=info_of(ep),
        env_log=ep.env_log,
        turn_starts=ep.turn_starts,
        **arrays,
    )
