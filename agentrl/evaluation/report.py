"""The scores of an evaluation: N held-out tasks × k samples, pass@k and avg@k.

This module owns the scores and the report (:class:`EvalReport`, written as
``results.json`` by :mod:`agentrl.evaluation.runner`); running the episodes is the
rollout's. In: trajectories (k samples of each task). Out: :class:`EvalReport`.

pass@k is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language
Models Trained on Code"): with n samples of a task of which c succeed,
``pass@k = 1 - C(n - c, k) / C(n, k)``, averaged over tasks. avg@k is the mean success
rate over all k samples of a task, averaged over tasks.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from agentrl.types import Trajectory

EVAL_KIND = "eval"
RESULTS_FILE = "results.json"


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one task: ``1 - C(n - c, k) / C(n, k)``.

    Args:
        n: samples drawn for the task.
        c: how many of them succeeded.
        k: the budget scored (at most n).

    Raises:
        ValueError: unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not 0 <= c <= n:
        raise ValueError(f"successes c = {c} must lie in [0, n = {n}]")
    if not 1 <= k <= n:
        raise ValueError(f"k = {k} must lie in [1, n = {n}] (pass@k needs at least k samples)")
    if n - c < k:  # every draw of k holds a success
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def reported_ks(k: int) -> list[int]:
    """The budgets reported for k samples a task: 1, 2, 4, ... below k, and k."""
    ks = [2**i for i in range(k.bit_length()) if 2**i < k]
    return [*ks, k]


@dataclasses.dataclass(frozen=True, slots=True)
class TaskResult:
    """The k episodes of one task, scored."""

    task_id: str
    seed: int | None
    samples: int
    successes: int
    pass_at: dict[int, float]
    reward_mean: float
    tool_use_rate: float
    turns_mean: float
    tokens_mean: float
    """Sampled (completion) tokens per episode."""
    failed: int

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["pass_at"] = {f"pass@{k}": v for k, v in self.pass_at.items()}
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class EvalReport:
    """The whole evaluation: means over tasks, and every task's row."""

    env_id: str
    model: str
    k: int
    success_reward: float
    tasks: list[TaskResult]

    @property
    def episodes(self) -> int:
        return sum(t.samples for t in self.tasks)

    def pass_at(self, k: int) -> float:
        """pass@k averaged over the tasks that have at least k samples."""
        return _mean([t.pass_at[k] for t in self.tasks if k in t.pass_at])

    def summary(self) -> dict[str, float]:
        """The headline figures: pass@j for each reported j, avg@k, and the means."""
        w = [t.samples for t in self.tasks]
        return {
            **{f"pass@{j}": self.pass_at(j) for j in reported_ks(self.k)},
            f"avg@{self.k}": _mean([t.successes / t.samples for t in self.tasks]),
            "reward_mean": _weighted([t.reward_mean for t in self.tasks], w),
            "tool_use_rate": _weighted([t.tool_use_rate for t in self.tasks], w),
            "turns_per_episode": _weighted([t.turns_mean for t in self.tasks], w),
            "tokens_per_episode": _weighted([t.tokens_mean for t in self.tasks], w),
            "failed": float(sum(t.failed for t in self.tasks)),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "env_id": self.env_id,
            "model": self.model,
            "k": self.k,
            "tasks": len(self.tasks),
            "episodes": self.episodes,
            "success_reward": self.success_reward,
            **self.summary(),
            "per_task": [t.to_json() for t in self.tasks],
        }


def score_task(
    task_id: str, episodes: Sequence[Sequence[Trajectory]], *, k: int, success_reward: float
) -> TaskResult:
    """One task's row from its episodes (each episode: its segments in order)."""
    finals = [segments[-1] for segments in episodes]
    n = len(finals)
    c = sum(t.reward >= success_reward for t in finals)
    return TaskResult(
        task_id=task_id,
        seed=finals[0].seed if finals else None,
        samples=n,
        successes=c,
        pass_at={j: pass_at_k(n, c, j) for j in reported_ks(k) if j <= n},
        reward_mean=_mean([t.reward for t in finals]),
        tool_use_rate=_mean([_used_tools(s) for s in episodes]),
        turns_mean=_mean([_turns(s) for s in episodes]),
        tokens_mean=_mean([sum(int(t.loss_mask.sum()) for t in s) for s in episodes]),
        failed=sum(t.status == "failed" for t in finals),
    )


def eval_report(
    trajectories: Iterable[Trajectory], *, env_id: str, model: str, k: int, success_reward: float
) -> EvalReport:
    """Score ended trajectories (several segments of an episode are joined), by task."""
    by_task: dict[str, dict[str, list[Trajectory]]] = defaultdict(lambda: defaultdict(list))
    for t in trajectories:
        by_task[t.task_id][t.episode_id].append(t)
    tasks = []
    for task_id, episodes in by_task.items():
        ordered = [sorted(s, key=lambda t: t.segment) for _, s in sorted(episodes.items())]
        tasks.append(score_task(task_id, ordered, k=k, success_reward=success_reward))
    tasks.sort(key=lambda t: (t.seed is None, t.seed, t.task_id))
    return EvalReport(env_id, model, k, success_reward, tasks)


def _used_tools(segments: Sequence[Trajectory]) -> bool:
    return any(s.kind == "tool" for t in segments for s in t.spans)


def _turns(segments: Sequence[Trajectory]) -> int:
    return len({s.turn for t in segments for s in t.spans if s.kind == "assistant"})


def _mean(values: Sequence[float | int | bool]) -> float:
    return sum(float(v) for v in values) / len(values) if values else float("nan")


def _weighted(values: Sequence[float], weights: Sequence[int]) -> float:
    pairs = [(v, w) for v, w in zip(values, weights, strict=True) if not math.isnan(v)]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else float("nan")
