"""``agentrl eval``'s run: N held-out tasks × k samples as a rollout, then the report.

An evaluation is a rollout (:mod:`agentrl.rollout.job`) of kind "eval" whose group
size is k: the same scheduler and runner as training, every episode recorded in the
eval directory's episode store (so ``agentrl replay`` and ``--resume`` work on it),
nothing trained. The report is computed from the store once the episodes have ended,
so a resumed evaluation scores every episode once, whichever run sampled it.

In: a :class:`~agentrl.rollout.job.RolloutJob` (:func:`eval_config` makes its config
from a run's). Out: :class:`~agentrl.evaluation.report.EvalReport`, also written as
``results.json``. The command line itself is :mod:`agentrl.cli.eval`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

from agentrl.config import RunConfig
from agentrl.errors import ConfigError
from agentrl.evaluation.report import EVAL_KIND, RESULTS_FILE, EvalReport, eval_report
from agentrl.rollout.job import RolloutJob, run_rollout
from agentrl.store import EpisodeStore


async def run_eval(job: RolloutJob, *, resume: bool = False) -> EvalReport:
    """Run (or continue) the evaluation, then score it and write ``results.json``.

    ``job.config.rollout.group_size`` is k; ``job.kind`` must be "eval".
    """
    if job.kind != EVAL_KIND:
        raise ValueError(f"run_eval needs a job of kind {EVAL_KIND!r}, got {job.kind!r}")
    await run_rollout(job, resume=resume)
    return await asyncio.to_thread(write_report, job)


def write_report(job: RolloutJob) -> EvalReport:
    """Score the episodes in ``job.out_dir``'s store; write ``results.json`` there."""
    cfg = job.config
    with EpisodeStore.open(job.out_dir, create=False) as store:
        report = eval_report(
            store.all_trajectories(),
            env_id=job.env_id,
            model=job.source or cfg.model.path,
            k=cfg.rollout.group_size,
            success_reward=cfg.eval.success_reward,
        )
    path = Path(job.out_dir) / RESULTS_FILE
    path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    return report


def check_k(config: RunConfig) -> None:
    """Refuse a k above the concurrency: a task's k samples run at the same time.

    Raises:
        ConfigError: ``eval.k`` > ``rollout.concurrency``.
    """
    if config.eval.k > config.rollout.concurrency:
        raise ConfigError(
            f"-k {config.eval.k} (eval.k) must be at most --concurrency "
            f"{config.rollout.concurrency} (rollout.concurrency): a task's k samples run at "
            f"the same time"
        )


def eval_config(config: RunConfig, model: str) -> RunConfig:
    """The config the episodes run under: k samples a task (the group), the eval
    temperature, held-out seeds from eval.first_seed, ``model`` sampling."""
    ev = config.eval  # k was checked against the concurrency (check_k)
    return dataclasses.replace(
        config,
        model=dataclasses.replace(config.model, path=model),
        env=dataclasses.replace(config.env, first_seed=ev.first_seed),
        rollout=dataclasses.replace(config.rollout, group_size=ev.k, temperature=ev.temperature),
    )
