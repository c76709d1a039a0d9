"""``agentrl eval``: score a model or a trained run on held-out tasks (pass@k, avg@k).

MODEL is 'tiny', a model folder, a hub name, or the run directory of ``agentrl train``
(its final model, or ``--step S``'s checkpoint; its config is the base of the
settings). The episodes run as an ``agentrl rollout`` of kind "eval" whose group size
is k; :mod:`agentrl.evaluation` runs and scores them (this module is the command line).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.cli.parsers import _overrides
from agentrl.runtime.stopping import Stopped, ensure_reaper, run_stoppable

if TYPE_CHECKING:
    from agentrl.config import RunConfig
    from agentrl.evaluation import EvalReport
    from agentrl.replay.policy import Policy
    from agentrl.rollout.job import RolloutJob


def _eval(args: argparse.Namespace, extra: list[str]) -> int:
    from agentrl.env import import_env_modules, load_env_plugins
    from agentrl.errors import ConfigError
    from agentrl.evaluation import EVAL_KIND
    from agentrl.rollout.job import resumed_job

    ensure_reaper()
    load_env_plugins()
    import_env_modules(args.imports, key="--import")
    if args.resume:
        if args.out is None:
            raise ConfigError("--resume needs --out EVAL_DIR (the evaluation to continue)")
        job = resumed_job(Path(args.out), args.env, kind=EVAL_KIND)
        import_env_modules([i for i in job.config.env.imports if i not in args.imports])
        return _stoppable(job, resume=True)
    if args.model is None:
        raise ConfigError("give the model to evaluate: 'tiny', a model folder or a run directory")
    job = _new_job(args, extra)
    import_env_modules([i for i in job.config.env.imports if i not in args.imports])
    return _stoppable(job, resume=False)


def _new_job(args: argparse.Namespace, extra: list[str]) -> RolloutJob:
    """The evaluation's settings: the run's config (a run directory) or --config, then
    overrides and flags; the eval section's seeds, temperature and k applied."""
    from agentrl.config import RunConfig
    from agentrl.errors import ConfigError
    from agentrl.evaluation import EVAL_KIND, check_k, eval_config
    from agentrl.rollout.job import RolloutJob

    run_dir = Path(args.model)
    is_run = (run_dir / "config.toml").is_file()
    overrides = _overrides(args, extra)
    if args.env is not None:
        overrides.append(f"--env.id={json.dumps(args.env)}")
    base = args.config or (run_dir / "config.toml" if is_run else None)
    # eval.k is the group size (set below); 1 here so that load's checks don't judge
    # the training group size against the eval's concurrency
    config = RunConfig.load(base, [*overrides, "--rollout.group_size=1"])
    if not config.env.id:
        raise ConfigError("give the env to evaluate on: --env ID")
    if config.eval.episodes < 1:
        raise ConfigError("give the number of held-out tasks: --episodes N (sets eval.episodes)")
    policy = _policy(run_dir, config, args.step) if is_run else None
    if args.step is not None and policy is None:
        raise ConfigError(f"--step needs a run directory of `agentrl train`; {args.model!r} is not")
    check_k(config)  # before _kept writes into OUT: a refused -k leaves OUT as it was
    out = Path(args.out or f"runs/eval-{time.strftime('%Y%m%d-%H%M%S')}")
    model = _kept(policy, out) if policy else args.model
    config = eval_config(config, model)
    return RolloutJob(
        config=config,
        episodes=config.eval.episodes * config.eval.k,
        out_dir=out,
        kind=EVAL_KIND,
        adapter=policy.adapter if policy else None,
        source=policy.label if policy else args.model,
    )


def _policy(run_dir: Path, config: RunConfig, step: int | None) -> Policy:
    """A train run's final model (or step ``step``'s checkpoint), found as
    ``agentrl replay`` finds the policy of an episode."""
    from agentrl.errors import ConfigError
    from agentrl.replay.policy import recorded_policy

    if step is None:
        final = run_dir / "model"
        if not final.is_dir():
            raise ConfigError(f"{run_dir} has no final model yet ({final}); give --step S")
        policy = recorded_policy(run_dir, config, "train", version=2**62)  # model/
        version = _final_version(run_dir)
        return dataclasses.replace(
            policy, version=version, label=f"{run_dir}: final model (version {version})"
        )
    meta = run_dir / "checkpoints" / f"step-{step:06d}" / "trainer.json"
    if not meta.is_file():
        kept = sorted(p.name for p in (run_dir / "checkpoints").glob("step-*"))
        raise ConfigError(f"--step {step}: no checkpoint {meta.parent}; kept: {kept or 'none'}")
    version = int(json.loads(meta.read_text())["version"])
    policy = recorded_policy(run_dir, config, "train", version)
    return dataclasses.replace(policy, label=f"{run_dir}: step {step} (version {version})")


def _final_version(run_dir: Path) -> int:
    """The version of a train run's final model: its status file's (written as the run
    ends), else the newest kept checkpoint's."""
    from agentrl.replay.policy import newest_version

    try:
        return int(json.loads((run_dir / "status.json").read_text())["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return newest_version(run_dir / "checkpoints", 0)


def _kept(policy: Policy, out: Path) -> str:
    """The policy's model folder; one assembled for a checkpoint (a temporary folder of
    links) moves into the eval directory, so that --resume and replay find it."""
    import shutil

    from agentrl.errors import ConfigError
    from agentrl.store import STORE_FILE

    if policy.cleanup is None:
        return policy.model
    if (out / STORE_FILE).exists() or (out / "policy").exists():
        shutil.rmtree(policy.cleanup, ignore_errors=True)
        raise ConfigError(
            f"{str(out)!r} already holds an eval; continue it with --resume, "
            f"or choose another --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    return str(shutil.move(policy.cleanup, out / "policy"))


def _stoppable(job: RolloutJob, *, resume: bool) -> int:
    """Run the evaluation; SIGTERM/SIGHUP stop it like Ctrl-C, with the resume command."""
    from agentrl.evaluation import run_eval

    hint = f"continue with: agentrl eval --resume --out {job.out_dir}"
    try:
        report = run_stoppable(
            run_eval(job, resume=resume),
            grace_s=job.config.run.stop_grace_s,
            on_hard_stop=lambda why: print(hint, file=sys.stderr),
        )
    except KeyboardInterrupt as e:
        print(f"{e if isinstance(e, Stopped) else 'interrupted'}; {hint}", file=sys.stderr)
        return e.exit_code if isinstance(e, Stopped) else 130
    from agentrl.status import env_offers_tools

    _print_report(report, job.out_dir, tools=env_offers_tools(job.config.env))
    return 0


def _print_report(report: EvalReport, out: Path, *, tools: bool = True) -> None:
    """The table and summary lines (``tools``: the env has tools; tool use only then)."""
    from rich.console import Console
    from rich.table import Table

    ks = [k for k in report.summary() if k.startswith("pass@")]
    table = Table(title=f"{report.env_id}: {len(report.tasks)} tasks × {report.k} samples")
    for column in ("seed", "ok/n", *ks, "reward", *(["tools"] if tools else []), "turns", "tokens"):
        table.add_column(column, justify="right", no_wrap=True)
    for t in report.tasks:
        seed = str(t.seed if t.seed is not None else t.task_id)
        table.add_row(
            seed,
            f"{t.successes}/{t.samples}",
            *[_fmt(t.pass_at.get(int(k[5:]), math.nan)) for k in ks],
            f"{t.reward_mean:.3f}",
            *([f"{t.tool_use_rate:.0%}"] if tools else []),
            f"{t.turns_mean:.1f}",
            f"{t.tokens_mean:.0f}",
        )
    Console().print(table)
    s = report.summary()
    head = ", ".join(f"{k} {s[k]:.3f}" for k in (*ks, f"avg@{report.k}"))
    print(f"{report.model} on {report.env_id} ({report.episodes} episodes): {head}")
    tool_use = f"tool use {s['tool_use_rate']:.1%}, " if tools else ""
    print(
        f"mean reward {s['reward_mean']:.3f}, {tool_use}"
        f"{s['turns_per_episode']:.2f} turns and {s['tokens_per_episode']:.1f} sampled "
        f"tokens per episode, {s['failed']:.0f} failed; "
        f"written to {out / 'results.json'}"
    )


def _fmt(value: Any) -> str:
    return "-" if isinstance(value, float) and math.isnan(value) else f"{value:.3f}"
