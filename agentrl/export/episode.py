"""One recorded episode as the formats see it: turns, tool calls paired with results,
the tokens of each turn, and what the episode is (metadata, relations).

Both exporters (:mod:`.inspect_log`, :mod:`.atif`) read an episode through
:func:`turns_of` and :func:`metadata_of`, so they agree on which call a tool result
answers and on what the metadata holds. Nothing here re-tokenizes: token ids, logprobs
and versions are the recorded arrays, sliced by the recorded spans.

In: a :class:`~agentrl.replay.Recorded` and the run's config. Out: :class:`Turn` lists
and plain dicts.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

from agentrl.replay import Recorded
from agentrl.types import Message, SegmentArrays

_RELATED = re.compile(r"^(?P<of>.+)~(?:fork@(?P<turn>\d+)|resumed)-\d+$")
"""Ids of the episodes ``agentrl replay`` makes: ``<episode>~fork@T-N``, ``<episode>~resumed-N``
(built in :mod:`agentrl.cli.replay`)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """One tool call of a turn and its result (``result`` None: no result was recorded)."""

    id: str
    name: str
    arguments: dict[str, Any]
    result: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class TurnTokens:
    """A turn's tokens in its segment: the prompt it was sampled from, what it sampled."""

    segment: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    versions: list[int]


@dataclasses.dataclass(slots=True)
class Turn:
    """An assistant turn with its calls, the messages after it (tool results that answer
    no call, env replies), its reward and tokens; turn -1 holds the messages before the
    first assistant turn (system prompt, first observation)."""

    index: int
    assistant: Message | None
    calls: list[Call] = dataclasses.field(default_factory=list)
    after: list[Message] = dataclasses.field(default_factory=list)
    reward: float | None = None
    tokens: TurnTokens | None = None


def turns_of(recorded: Recorded) -> list[Turn]:
    """The episode's messages grouped by assistant turn (the first entry: turn -1)."""
    tool_log = [e for e in recorded.env_log if "tool" in e]
    tokens = turn_tokens(recorded.segments())
    rewards = recorded.turn_rewards
    turns = [Turn(-1, None)]
    for message in recorded.messages:
        turn = turns[-1]
        if message["role"] == "assistant":
            k = len(turns) - 1
            reward = rewards[k] if k < len(rewards) else None
            turns.append(Turn(k, message, _stated_calls(message, k), [], reward, tokens.get(k)))
        elif message["role"] == "tool" and turn.assistant is not None:
            _answer(turn, message, tool_log)
        else:
            turn.after.append(message)
    return turns


def _stated_calls(message: Message, turn: int) -> list[Call]:
    """The calls the assistant message carries itself (templates that render them)."""
    calls = []
    for i, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function", call)
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = {"raw": arguments}
        calls.append(
            Call(
                str(call.get("id") or f"call-{turn}-{i}"),
                str(function.get("name")),
                dict(arguments),
                None,
            )
        )
    return calls


def _answer(turn: Turn, message: Message, tool_log: list[dict[str, Any]]) -> None:
    """Attach a tool message to the call it answers: by id, else the next unanswered
    call, else the next call of the env log (what ran, with its arguments) of that name;
    a message that answers none (an unparseable call's error) stays in ``after``."""
    content = str(message.get("content", ""))
    open_calls = [i for i, c in enumerate(turn.calls) if c.result is None]
    wanted = message.get("tool_call_id")
    for i in open_calls:
        if wanted is None or turn.calls[i].id == wanted:
            turn.calls[i] = dataclasses.replace(turn.calls[i], result=content)
            if tool_log and tool_log[0]["tool"] == turn.calls[i].name:
                tool_log.pop(0)  # the same call, as the env log has it
            return
    if tool_log and tool_log[0]["tool"] == message.get("name"):
        entry = tool_log.pop(0)
        call_id = f"call-{turn.index}-{len(turn.calls)}"
        turn.calls.append(
            Call(call_id, str(entry["tool"]), dict(entry.get("arguments") or {}), content)
        )
        return
    turn.after.append(message)


def turn_tokens(segments: list[SegmentArrays]) -> dict[int, TurnTokens]:
    """Each assistant turn's tokens: the segment tokens before its first assistant span
    (its prompt) and those of its assistant spans (what it sampled)."""
    out: dict[int, TurnTokens] = {}
    for number, seg in enumerate(segments):
        by_turn: dict[int, list[tuple[int, int]]] = {}
        for span in seg.spans:
            if span.kind == "assistant":
                by_turn.setdefault(span.turn, []).append((span.start, span.end))
        for turn, bounds in by_turn.items():
            ranges = [slice(start, end) for start, end in bounds]
            out[turn] = TurnTokens(
                segment=number,
                prompt_ids=seg.token_ids[: bounds[0][0]].tolist(),
                completion_ids=[t for r in ranges for t in seg.token_ids[r].tolist()],
                logprobs=[x for r in ranges for x in seg.logprobs[r].tolist()],
                versions=[v for r in ranges for v in seg.versions[r].tolist()],
            )
    return out


def related_of(episode_id: str, attempt: int) -> dict[str, Any] | None:
    """How an episode relates to another: a fork (``of``, ``at_turn``), a resumed
    checkpoint (``of``), or a later attempt of the same episode (``previous_attempt``)."""
    match = _RELATED.match(episode_id)
    if match is not None:
        turn = match["turn"]
        kind = "resumed" if turn is None else "fork"
        return {"kind": kind, "of": match["of"], **({} if turn is None else {"at_turn": int(turn)})}
    if attempt > 0:
        return {"kind": "attempt", "of": episode_id, "previous_attempt": attempt - 1}
    return None


def metadata_of(recorded: Recorded, row: dict[str, Any] | None = None) -> dict[str, Any]:
    """What an episode is: env, seed, attempt, state, why it ended, its policy versions."""
    task = recorded.task
    sampled = [v for seg in recorded.segments() for v in seg.versions.tolist() if v >= 0]
    meta: dict[str, Any] = {
        "episode_id": recorded.episode_id,
        "task_id": task.task_id,
        "env_id": task.env_id,
        "seed": task.seed,
        "attempt": recorded.attempt,
        "state": recorded.state,
        "policy_versions": sorted(set(sampled)),
        "turn_rewards": list(recorded.turn_rewards),
        "related": related_of(recorded.episode_id, recorded.attempt),
    }
    if recorded.partial is None:
        t = recorded.trajectories[0]
        meta.update(
            status=t.status,
            reason=t.reason,
            reward=t.reward,
            failure=None if t.failure is None else t.failure.value,
            segments=len(recorded.trajectories),
            timings=t.timings.as_dict(),
        )
    else:
        meta.update(
            status=None,
            reason="unfinished",
            reward=None,
            failure=None,
            checkpoint_version=recorded.partial.version,
        )
    return meta


def finite(values: list[float]) -> list[float | None]:
    """``values`` with NaN as None (JSON has no NaN)."""
    return [None if math.isnan(x) else x for x in values]
