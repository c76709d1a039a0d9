"""Episodes as an Inspect AI ``.eval`` log, written with Inspect's own log writer.

One sample per episode attempt (``inspect view`` opens the file as it opens its own
logs; ``inspect_ai.log.read_eval_log`` reads it):

* ``messages``: the episode's chat, assistant turns with their tool calls
  (``ToolCall``) and each result a ``tool`` message naming its call; each assistant
  message's ``metadata`` has its turn, reward and the policy versions that sampled it;
* ``scores["reward"]``: the episode's reward, its reason as the explanation, the
  failure kind and per-turn rewards in the score's metadata (no score while unfinished);
* ``metadata``: env id, seed, attempt, state, status, failure kind, policy versions,
  relation to a fork's or retry's origin; the run's config is the log's metadata.

The log asks the viewer to show its content as plain text (``trust_content=False``):
model and env text is never rendered as Markdown or HTML.

The samples stream into Inspect's ``EvalRecorder`` (the writer ``write_eval_log``
itself uses), written into the zip every :data:`FLUSH_EVERY` samples, so the samples
are never all in memory; Inspect keeps a summary of every sample for the log's sample
list (its ``summaries.json``), the one part that grows with the log (about 14 KB of
peak memory per sample, ``benchmarks/bench_export.py``). Needs
``pip install 'agentrl[export]'``.
"""

from __future__ import annotations

import datetime
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentrl.export.episode import Turn, metadata_of, turns_of
from agentrl.export.runinfo import RunInfo, require
from agentrl.replay import Recorded

SCORER = "reward"
FLUSH_EVERY = 200
"""Samples buffered before they are written into the log's zip: memory is bounded by
this many samples (Inspect compares each new sample with those buffered, so a larger
buffer costs time per sample)."""


def to_sample(recorded: Recorded, run: RunInfo) -> Any:
    """The episode as an ``inspect_ai.log.EvalSample``."""
    from inspect_ai.log import EvalSample
    from inspect_ai.model import ChatMessageUser, ModelOutput
    from inspect_ai.scorer import Score

    meta = metadata_of(recorded)
    turns = turns_of(recorded)
    messages: list[Any] = []
    for turn in turns:
        messages.extend(_messages(turn))
        if turn.assistant is None:
            first = len(messages)  # the input: what came before the first turn
    last = next((t.assistant for t in reversed(turns) if t.assistant is not None), None)
    answer = str(last.get("content") or "") if last else ""
    scores = None
    if meta["reward"] is not None:
        scores = {
            SCORER: Score(
                value=meta["reward"],
                answer=answer,
                explanation=meta["reason"],
                metadata={"failure": meta["failure"], "turn_rewards": meta["turn_rewards"]},
            )
        }
    return EvalSample(
        id=f"{recorded.episode_id}#{recorded.attempt}",
        epoch=1,
        input=messages[:first] or [ChatMessageUser(content="")],
        target="",
        messages=messages,
        output=ModelOutput.from_content(run.model or "agentrl", answer),
        scores=scores,
        metadata=meta,
        total_time=(meta.get("timings") or {}).get("total_s"),
    )


def _messages(turn: Turn) -> list[Any]:
    """A turn as Inspect chat messages."""
    from inspect_ai.model import (
        ChatMessageAssistant,
        ChatMessageSystem,
        ChatMessageTool,
        ChatMessageUser,
    )
    from inspect_ai.tool import ToolCall

    out: list[Any] = []
    if turn.assistant is not None:
        versions = sorted({v for v in turn.tokens.versions}) if turn.tokens else []
        calls = [ToolCall(id=c.id, function=c.name, arguments=c.arguments) for c in turn.calls]
        out.append(
            ChatMessageAssistant(
                content=str(turn.assistant.get("content") or ""),
                tool_calls=calls or None,
                metadata={"turn": turn.index, "reward": turn.reward, "policy_versions": versions},
            )
        )
        out.extend(
            ChatMessageTool(content=c.result, tool_call_id=c.id, function=c.name)
            for c in turn.calls
            if c.result is not None
        )
    for m in turn.after:
        text = str(m.get("content", ""))
        if m["role"] == "system":
            out.append(ChatMessageSystem(content=text))
        elif m["role"] == "tool":
            out.append(ChatMessageTool(content=text, function=m.get("name")))
        else:
            out.append(ChatMessageUser(content=text))
    return out


async def write_inspect(episodes: Iterable[Recorded], run: RunInfo, path: Path) -> int:
    """Write the episodes as one ``.eval`` log at ``path``; return the sample count."""
    require("inspect_ai")
    from inspect_ai.log import EvalMetric, EvalResults, EvalScore, EvalStats
    from inspect_ai.log._condense import condense_sample
    from inspect_ai.log._recorders.eval import EvalRecorder

    started = _now()
    spec, plan = _spec(run, path, started)
    count, scored, total = 0, 0, 0.0
    with tempfile.TemporaryDirectory(prefix="agentrl-export-") as scratch:
        recorder = EvalRecorder(scratch)
        await recorder.log_init(spec, str(path), clean=True)
        await recorder.log_start(spec, plan)
        for recorded in episodes:
            sample = to_sample(recorded, run)
            await recorder.log_sample(spec, condense_sample(sample))
            count += 1
            if count % FLUSH_EVERY == 0:
                await _write_buffered(recorder, spec)
            if sample.scores:  # unfinished episodes have no reward yet
                scored, total = scored + 1, total + sample.metadata["reward"]
        mean = EvalMetric(name="mean", value=total / scored if scored else 0.0)
        results = EvalResults(
            total_samples=count,
            completed_samples=count,
            scores=[EvalScore(name=SCORER, scorer=SCORER, metrics={"mean": mean})],
        )
        await recorder.log_finish(
            spec, "success", EvalStats(started_at=started, completed_at=_now()), results, None
        )
    return count


async def _write_buffered(recorder: Any, spec: Any) -> None:
    """Write the buffered samples into the log's (temporary) zip: ``recorder.flush``
    without its copy of the whole file to its place, which ``log_finish`` makes once.
    (The recorder's per-log file object, as ``EvalRecorder.flush`` reaches it; the
    ``inspect-ai`` version is pinned in the ``export`` extra.)"""
    await recorder.data[recorder._log_file_key(spec)].write_buffered_samples()


def _spec(run: RunInfo, path: Path, created: str) -> tuple[Any, Any]:
    """The log's ``EvalSpec`` (the run as a task) and an empty ``EvalPlan``."""
    from inspect_ai.log import EvalConfig, EvalDataset, EvalPlan, EvalSpec
    from inspect_ai.viewer import ViewerConfig

    spec = EvalSpec(
        created=created,
        task=f"agentrl/{run.name}",
        task_id=run.name,
        run_id=run.name,
        eval_id=path.stem,
        dataset=EvalDataset(name=run.name),
        model=f"agentrl/{run.model or 'unknown'}",
        config=EvalConfig(),
        packages={"agentrl": run.agentrl_version},
        metadata={"agentrl_run_config": run.config},
        viewer=ViewerConfig(trust_content=False),  # model and env text shown as plain text
    )
    return spec, EvalPlan()


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()
