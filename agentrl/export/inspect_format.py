"""Episodes as a folder of Inspect AI ``.eval`` logs, written with Inspect's public log API.

One sample per episode attempt (``inspect view --log-dir`` opens the folder as it opens
its own log directories; ``inspect_ai.log.read_eval_log`` reads each file):

* ``messages``: the episode's chat, assistant turns with their tool calls
  (``ToolCall``) and each result a ``tool`` message naming its call; each assistant
  message's ``metadata`` has its turn, reward and the policy versions that sampled it;
* ``scores["reward"]``: the episode's reward, its reason as the explanation, the
  failure kind and per-turn rewards in the score's metadata (no score while unfinished);
* ``metadata``: env id, seed, attempt, state, status, failure kind, policy versions,
  relation to a fork's or retry's origin; the run's config is each log's metadata.

The log asks the viewer to show its content as plain text (``trust_content=False``):
model and env text is never rendered as Markdown or HTML.

Constant memory: an ``.eval`` file holds a summary of every sample it contains (its
``summaries.json``, the viewer's sample list), which its writer keeps in memory until
the file is finished. So the export rolls to a new log every :data:`SAMPLES_PER_LOG`
samples (``<run>-0001.eval``, ``<run>-0002.eval``, ...), each written whole with
``write_eval_log_async``: memory is bounded by one log's samples, whatever the run's
size. Needs ``pip install 'agentrl[export]'``.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentrl.export.episode import Turn, metadata_of, turns_of
from agentrl.export.runinfo import RunInfo, require
from agentrl.replay import Recorded

SCORER = "reward"
SAMPLES_PER_LOG = 1000
"""Samples per ``.eval`` file: the export's memory is bounded by this many samples
(``benchmarks/bench_export.py``), and a folder of a 100,000-episode run holds 100 logs."""


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


async def write_inspect(episodes: Iterable[Recorded], run: RunInfo, folder: Path) -> int:
    """Write the episodes as ``.eval`` logs of up to :data:`SAMPLES_PER_LOG` samples
    each into ``folder``; return the sample count."""
    require("inspect_ai")
    count, part, samples = 0, 0, []
    started = _now()
    for recorded in episodes:
        samples.append(to_sample(recorded, run))
        count += 1
        if len(samples) == SAMPLES_PER_LOG:
            part += 1
            await _write_log(samples, run, folder / f"{run.name}-{part:04d}.eval", started)
            samples, started = [], _now()
    if samples or part == 0:  # an empty selection still gets one (empty) log
        await _write_log(samples, run, folder / f"{run.name}-{part + 1:04d}.eval", started)
    return count


async def _write_log(samples: list[Any], run: RunInfo, path: Path, started: str) -> None:
    """One finished ``.eval`` log of ``samples``, its mean reward over them."""
    from inspect_ai.log import (
        EvalLog,
        EvalMetric,
        EvalResults,
        EvalScore,
        EvalStats,
        write_eval_log_async,
    )

    rewards = [s.metadata["reward"] for s in samples if s.scores]  # unfinished: no score
    mean = {"mean": EvalMetric(name="mean", value=sum(rewards) / max(len(rewards), 1))}
    spec, plan = _spec(run, path, started)
    log = EvalLog(
        status="success",
        eval=spec,
        plan=plan,
        results=EvalResults(
            total_samples=len(samples),
            completed_samples=len(samples),
            scores=[EvalScore(name=SCORER, scorer=SCORER, metrics=mean)] if rewards else [],
        ),
        stats=EvalStats(started_at=started, completed_at=_now()),
        samples=samples,
    )
    await write_eval_log_async(log, path, format="eval")


def _spec(run: RunInfo, path: Path, created: str) -> tuple[Any, Any]:
    """The log's ``EvalSpec`` (the run as a task) and an empty ``EvalPlan``."""
    from inspect_ai.log import EvalConfig, EvalDataset, EvalPlan, EvalSpec
    from inspect_ai.viewer import ViewerConfig

    spec = EvalSpec(
        created=created,
        task=f"agentrl/{run.name}",
        task_id=path.stem,  # one per log: the viewer lists logs of one task_id as retries
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
