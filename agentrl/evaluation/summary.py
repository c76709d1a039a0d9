"""The row of one evaluation inside ``agentrl train`` and its line for the user.

:func:`eval_summary` turns an evaluation's trajectories into the row ``metrics.jsonl``
(kind "eval") and ``status.json`` hold: success rate, pass@j and avg@k (scored by
:mod:`agentrl.evaluation.report`), tool use, reward, turns; :func:`eval_line` is the
one line the run prints for it. Computes; writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.evaluation.report import eval_report
from agentrl.types import Trajectory


def eval_summary(
    label: str,
    step: int,
    version: int,
    trajectories: Sequence[Trajectory],
    *,
    k: int,
    success_reward: float,
    wall_s: float,
) -> dict[str, Any]:
    """The row of one evaluation (``metrics.jsonl`` kind "eval", ``status.json``).

    Args:
        label: "before", "during" (``eval.every``) or "after" (training).
        step: the optimizer step it was started after.
        version: the policy version it started with (one beside training may end on a
            newer one: ``version_last`` is the newest that sampled a token).
        trajectories: every ended trajectory (an episode's segments are joined by id).
        k: samples per task: pass@j for j = 1, 2, 4, ... k, and avg@k (see
            :mod:`agentrl.evaluation.report`).
        success_reward: a final reward at least this counts as a success.
        wall_s: how long the evaluation took.
    """
    report = eval_report(trajectories, env_id="", model="", k=k, success_reward=success_reward)
    figures = report.summary()
    finals = {t.episode_id: t for t in sorted(trajectories, key=lambda t: t.segment)}.values()
    newest = max((int(t.versions.max()) for t in trajectories if len(t.versions)), default=-1)
    return {
        "label": label,
        "step": step,
        "version": version,
        "version_last": max(newest, version),
        "tasks": len(report.tasks),
        "episodes": report.episodes,
        "k": k,
        "success_rate": _mean([t.reward >= success_reward for t in finals]),
        **{key: figures[key] for key in figures if key.startswith(("pass@", "avg@"))},
        "tool_use_rate": figures["tool_use_rate"],
        "reward_mean": figures["reward_mean"],
        "turns_per_episode": figures["turns_per_episode"],
        "turns_to_solve": _turns_to_solve(trajectories, success_reward),
        "failed": sum(t.status == "failed" for t in finals),
        "truncated": sum(t.status == "truncated" for t in finals),
        "wall_s": wall_s,
    }


def _turns_to_solve(trajectories: Sequence[Trajectory], success_reward: float) -> float:
    """Mean assistant turns of the episodes that succeeded (nan: none did)."""
    turns: dict[str, set[int]] = {}
    final: dict[str, Trajectory] = {}
    for t in sorted(trajectories, key=lambda t: t.segment):
        final[t.episode_id] = t
        turns.setdefault(t.episode_id, set()).update(
            s.turn for s in t.spans if s.kind == "assistant"
        )
    solved = [len(turns[e]) for e, t in final.items() if t.reward >= success_reward]
    return _mean(solved)


def eval_line(summary: Mapping[str, Any], *, tools: bool = True) -> str:
    """One line for an evaluation (see :func:`agentrl.evaluation.evaluate`);
    ``tools``: whether the env has tools (tool use is shown only then)."""
    ev = summary
    k = ev.get("k", 1)
    at = f"step {ev['step']}, " if ev["label"] == "during" else ""
    scores = f", pass@{k} {ev[f'pass@{k}']:.1%}" if k > 1 else ""
    tool_use = f", tool use {ev['tool_use_rate']:.1%}" if tools else ""
    return (
        f"eval {ev['label']} ({at}version {ev['version']}, {ev['episodes']} held-out "
        f"episodes): success {ev['success_rate']:.1%}{scores}{tool_use}, mean reward "
        f"{ev['reward_mean']:.3f}"
    )


def _mean(values: Sequence[float | int | bool]) -> float:
    return sum(float(v) for v in values) / len(values) if values else float("nan")
