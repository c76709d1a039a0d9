"""Exported episodes read back as data: trajectories, SFT examples, offline groups.

:func:`read_trajectories` takes a native JSONL export (``agentrl export --format
jsonl`` or ``agentrl replay --export``) or an ATIF export and yields the ended episodes
as :class:`~agentrl.types.Trajectory` values with the tokens exactly as recorded: the
ids, logprobs and versions are the file's, never re-rendered from the messages (an ATIF
trajectory's messages are rebuilt from its steps; its tokens come from the steps'
``metrics`` and the spans in ``extra.agentrl``). Unfinished episodes (checkpoints) are
skipped: they have no end to learn from.

:func:`sft_examples` turns them into the pre-tokenized examples
:func:`agentrl.sft.warm_start` trains on; :func:`offline_groups` into the
:class:`~agentrl.types.Group` values a training step consumes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.errors import ConfigError
from agentrl.types import Group, Task, TokenSpan, Trajectory


def read_trajectories(path: str | Path) -> Iterator[Trajectory]:
    """The ended episodes of a native JSONL or ATIF export, one segment at a time."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no file {str(path)!r}; give the path an `agentrl export` wrote")
    with path.open() as source:
        for number, line in enumerate(source, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            if record.get("kind") == "trajectory":
                yield Trajectory.from_json(record)
            elif "schema_version" in record and "steps" in record:
                yield from _from_atif(record)
            elif record.get("kind") != "partial":
                raise ConfigError(
                    f"{str(path)!r} line {number} is neither an agentrl trajectory nor an "
                    f"ATIF trajectory; read files written by `agentrl export`"
                )


def _from_atif(record: dict[str, Any]) -> Iterator[Trajectory]:
    """An ATIF trajectory's segments, rebuilt from its steps' tokens and spans."""
    from agentrl.export.atif_format import read_atif_record

    trajectory = read_atif_record(record)  # validated by the atif models
    meta = (trajectory.extra or {}).get("agentrl", {})
    if meta.get("status") is None:
        return
    agent = [s for s in trajectory.steps if s.source == "agent" and s.metrics is not None]
    for number, segment in enumerate(meta["segments"]):
        steps = [s for s in agent if s.metrics.extra["segment"] == number]
        ids, logprobs, versions = _segment_arrays(steps, segment["tail_token_ids"])
        spans = tuple(TokenSpan(*s) for s in segment["spans"])
        mask = np.zeros(len(ids), np.int8)
        for span in spans:
            if span.kind == "assistant":
                mask[span.start : span.end] = 1
        yield Trajectory(
            episode_id=meta["episode_id"],
            task_id=meta["task_id"],
            env_id=meta["env_id"],
            seed=meta["seed"],
            token_ids=ids,
            logprobs=logprobs,
            versions=versions,
            loss_mask=mask,
            spans=spans,
            messages=_messages(trajectory.steps),
            turn_rewards=meta["turn_rewards"],
            reward=meta["reward"],
            status=meta["status"],
            reason=meta["reason"],
            failure=meta["failure"],
            segment=number,
            attempt=meta["attempt"],
        )


def _segment_arrays(steps: list[Any], tail: list[int]) -> tuple[list[int], ...]:
    """A segment's ids, logprobs and versions: the last step's prompt and completion,
    the tail, and each step's sampled logprobs and versions at its place."""
    if not steps:
        return list(tail), [math.nan] * len(tail), [-1] * len(tail)
    last = steps[-1].metrics
    ids = [*last.prompt_token_ids, *last.completion_token_ids, *tail]
    logprobs, versions = [math.nan] * len(ids), [-1] * len(ids)
    for step in steps:
        m = step.metrics
        start = len(m.prompt_token_ids)
        if ids[start : start + len(m.completion_token_ids)] != m.completion_token_ids:
            raise ConfigError(
                f"ATIF step {step.step_id}: its completion tokens are not where "
                "its prompt ends in the segment; the file was not written by "
                "`agentrl export`"
            )
        logprobs[start : start + len(m.logprobs)] = m.logprobs
        versions[start : start + len(m.logprobs)] = m.extra["versions"]
    return ids, logprobs, versions


def _messages(steps: list[Any]) -> list[dict[str, Any]]:
    """Chat messages rebuilt from ATIF steps (for reading; the tokens are the record)."""
    out: list[dict[str, Any]] = []
    for step in steps:
        role = {"agent": "assistant"}.get(step.source, step.source)
        out.append({"role": role, "content": step.message})
        calls = {c.tool_call_id: c.function_name for c in step.tool_calls or []}
        for result in step.observation.results if step.observation else []:
            extra = result.extra or {}
            name = calls.get(result.source_call_id or "", extra.get("name"))
            message = {"role": extra.get("role", "tool"), "content": result.content}
            out.append({**message, "name": name} if message["role"] == "tool" else message)
    return out


def sft_examples(trajectories: Iterable[Trajectory]) -> Iterator[dict[str, list[int]]]:
    """Each segment as an example :func:`agentrl.sft.warm_start` trains on: the recorded
    token ids, and the loss on the tokens the policy sampled."""
    for t in trajectories:
        yield {"input_ids": t.token_ids.tolist(), "assistant_masks": t.loss_mask.tolist()}


def offline_groups(trajectories: Iterable[Trajectory]) -> list[Group]:
    """The trajectories grouped by task (each group complete with what the file holds),
    as a training step takes them from the queue."""
    groups: dict[str, Group] = {}
    for t in trajectories:
        if t.task_id not in groups:
            task = Task(t.task_id, t.env_id, t.seed if t.seed is not None else 0)
            groups[t.task_id] = Group(task, 0)
        groups[t.task_id].trajectories.append(t)
    for g in groups.values():
        g.size = len({t.episode_id for t in g.trajectories})
    return list(groups.values())
