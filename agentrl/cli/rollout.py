"""``agentrl rollout`` (record episodes, no training) and ``agentrl config`` (the
config reference)."""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from agentrl.cli.parsers import _overrides


def _rollout(args: argparse.Namespace, extra: list[str]) -> int:
    from pathlib import Path

    from agentrl.config import RunConfig
    from agentrl.env import import_env_modules, load_env_plugins
    from agentrl.errors import ConfigError
    from agentrl.rollout.job import RolloutJob, resumed_job, run_rollout

    load_env_plugins()
    if args.resume:
        if args.out is None:
            raise ConfigError("--resume needs --out RUN_DIR (the run to continue)")
        import_env_modules(args.imports, key="--import")
        job = resumed_job(Path(args.out), args.env_id)
        import_env_modules([i for i in job.config.env.imports if i not in args.imports])
        summary = asyncio.run(run_rollout(job, resume=True))
        return _print_rollout(summary, job.env_id, Path(args.out))
    overrides = _overrides(args, extra)
    if args.env_id is not None:
        overrides.append(f"--env.id={json.dumps(args.env_id)}")
    if args.imports:
        overrides.append(f"--env.imports={json.dumps(args.imports)}")
    if args.server:
        overrides.append('--inference.mode="server"')
    config = RunConfig.load(args.config, overrides)
    if not config.env.id:
        raise ConfigError("give the env id to roll out (or --resume --out RUN_DIR)")
    import_env_modules(config.env.imports)
    out = Path(args.out or f"runs/rollout-{time.strftime('%Y%m%d-%H%M%S')}")
    job = RolloutJob(config=config, episodes=args.episodes, out_dir=out)
    summary = asyncio.run(run_rollout(job))
    return _print_rollout(summary, config.env.id, out)


def _print_rollout(summary: dict[str, object], env_id: str, out: object) -> int:
    metrics: dict[str, float] = summary["metrics"]  # type: ignore[assignment]
    lag = metrics.get("loop_lag_s/p99", float("nan"))
    resumed = metrics.get("episodes_resumed", 0)
    print(f"{summary['episodes']} episodes of {env_id}: success {summary['success_rate']:.1%}, "
          f"{summary['tokens_per_s']:,.0f} tokens/s, loop lag p99 {lag * 1000:.0f} ms"
          + (f", {resumed:.0f} episodes continued from checkpoints" if summary["resumed"] else "")
          + f"; written to {out}")  # fmt: skip
    return 0


def _config(args: argparse.Namespace, extra: list[str]) -> int:
    from agentrl.config.reference import defaults_toml

    print(defaults_toml(), end="")
    return 0
