"""Episodes as ATIF trajectories (the Agent Trajectory Interchange Format, v1.8).

One trajectory per episode attempt, built and validated with the format's own Pydantic
models (the ``atif`` package, ``pip install 'agentrl[export]'``), written one JSON
document per line. The mapping:

* the messages before the first assistant turn are ``system`` and ``user`` steps; each
  assistant turn is an ``agent`` step with its text, its tool calls, and an observation
  holding the tool results (``source_call_id`` names the call) and the env's reply;
* the step's ``metrics`` carry the tokens as sampled: ``prompt_token_ids`` (the
  segment's tokens before the turn), ``completion_token_ids`` and ``logprobs``; the
  policy version of each completion token is in ``metrics.extra.versions``;
* ``session_id`` is the episode a fork, a resumed checkpoint or a retry came from (the
  episode's own id otherwise), ``trajectory_id`` is ``<episode>#<attempt>``, and
  ``extra.agentrl.related`` says how they relate; a fork's steps before the fork point
  are ``is_copied_context`` (the format's rule: left out of SFT data);
* ``extra.agentrl`` holds the episode's metadata and each segment's token spans and
  the tokens after its last turn, so :mod:`.readback` rebuilds the recorded arrays
  exactly.

Unfinished episodes are exported with the steps they have (their unfinished turn's
tokens are not a step); they have no ``status`` and are not read back as data.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from agentrl.export.episode import Turn, metadata_of, turns_of
from agentrl.export.runinfo import RunInfo, require
from agentrl.replay import Recorded, open_for_writing

SCHEMA_VERSION = "ATIF-v1.8"


def to_atif(recorded: Recorded, run: RunInfo) -> Any:
    """The episode as an ``atif.Trajectory`` (validated as it is built)."""
    require("atif")
    import atif

    meta = metadata_of(recorded)
    related = meta["related"]
    fork_at = related["at_turn"] if related and related["kind"] == "fork" else None
    steps: list[Any] = []
    turns = turns_of(recorded)
    for turn in turns:
        copied = True if fork_at is not None and turn.index < fork_at else None
        if turn.assistant is None:
            for m in turn.after:
                source = "system" if m["role"] == "system" else "user"
                steps.append(
                    atif.Step(
                        step_id=len(steps) + 1,
                        source=source,
                        message=str(m.get("content", "")),
                        is_copied_context=copied,
                    )
                )
            continue
        steps.append(_agent_step(atif, turn, len(steps) + 1, copied))
    segments = recorded.segments()
    agentrl_extra = {
        **meta,
        "segments": [
            {"spans": [dataclasses.astuple(s) for s in seg.spans], "tail_token_ids": _tail(seg)}
            for seg in segments
        ],
    }
    prompt = sum(len(t.tokens.prompt_ids) for t in turns if t.tokens)
    completion = sum(len(t.tokens.completion_ids) for t in turns if t.tokens)
    return atif.Trajectory(
        schema_version=SCHEMA_VERSION,
        session_id=related["of"] if related else recorded.episode_id,
        trajectory_id=f"{recorded.episode_id}#{recorded.attempt}",
        agent=atif.Agent(
            name="agentrl",
            version=run.agentrl_version,
            model_name=run.model,
            tool_definitions=recorded.partial.tools if recorded.partial else None,
            extra={"run": run.name},
        ),
        steps=steps,
        final_metrics=atif.FinalMetrics(
            total_prompt_tokens=prompt,
            total_completion_tokens=completion,
            total_steps=len(steps),
            extra={"reward": meta["reward"]},
        ),
        extra={"agentrl": agentrl_extra, "run_config": run.config},
    )


def _agent_step(atif: Any, turn: Turn, step_id: int, copied: bool | None) -> Any:
    """An assistant turn: its text, calls, their results and the env's reply, tokens."""
    assert turn.assistant is not None
    calls = [
        atif.ToolCall(tool_call_id=c.id, function_name=c.name, arguments=c.arguments)
        for c in turn.calls
    ] or None
    results = [
        atif.ObservationResult(source_call_id=c.id, content=c.result)
        for c in turn.calls
        if c.result is not None
    ]
    results += [
        atif.ObservationResult(
            content=str(m.get("content", "")), extra={"role": m["role"], "name": m.get("name")}
        )
        for m in turn.after
    ]
    metrics = None
    if turn.tokens is not None:
        t = turn.tokens
        metrics = atif.Metrics(
            prompt_tokens=len(t.prompt_ids),
            completion_tokens=len(t.completion_ids),
            prompt_token_ids=t.prompt_ids,
            completion_token_ids=t.completion_ids,
            logprobs=t.logprobs,
            extra={"versions": t.versions, "segment": t.segment},
        )
    return atif.Step(
        step_id=step_id,
        source="agent",
        message=str(turn.assistant.get("content") or ""),
        tool_calls=calls,
        observation=atif.Observation(results=results) if results else None,
        metrics=metrics,
        extra={"turn": turn.index, "reward": turn.reward},
        is_copied_context=copied,
    )


def _tail(seg: Any) -> list[int]:
    """The segment's tokens after its last assistant span (no step's prompt holds them)."""
    ends = [s.end for s in seg.spans if s.kind == "assistant"]
    return seg.token_ids[max(ends, default=0) :].tolist()


def write_atif(episodes: Iterable[Recorded], run: RunInfo, path: Path) -> int:
    """Write each episode as one ATIF trajectory per line of ``path``; return the count."""
    count = 0
    with open_for_writing(path) as sink:
        for recorded in episodes:
            sink.write(json.dumps(to_atif(recorded, run).to_json_dict()) + "\n")
            count += 1
    return count


def read_atif(path: Path) -> Iterator[Any]:
    """The ``atif.Trajectory`` documents of a file :func:`write_atif` wrote, validated."""
    require("atif")
    import atif

    with path.open() as source:
        for line in source:
            if line.strip():
                yield atif.Trajectory.model_validate_json(line)


def read_atif_record(record: dict[str, Any]) -> Any:
    """One parsed JSON document as an ``atif.Trajectory``, validated."""
    require("atif")
    import atif

    return atif.Trajectory.model_validate(record)
