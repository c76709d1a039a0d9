"""``agentrl rollout`` (record episodes, no training) and ``agentrl config`` (the
config reference)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.cli.parsers import _overrides
from agentrl.runtime.stopping import Stopped, ensure_reaper, run_stoppable

if TYPE_CHECKING:
    from agentrl.config import RunConfig
    from agentrl.rollout.job import RolloutJob


def _rollout(args: argparse.Namespace, extra: list[str]) -> int:
    from agentrl.env import import_env_modules, load_env_plugins
    from agentrl.errors import ConfigError
    from agentrl.rollout.job import RolloutJob, resumed_job, run_rollout

    ensure_reaper()
    load_env_plugins()
    if args.resume:
        if args.out is None:
            raise ConfigError("--resume needs --out RUN_DIR (the run to continue)")
        import_env_modules(args.imports, key="--import")
        job = resumed_job(Path(args.out), args.env_id)
        import_env_modules([i for i in job.config.env.imports if i not in args.imports])
        return _stoppable(run_rollout(job, resume=True), job, Path(args.out))
    config = _rollout_config(args, extra)
    out = Path(args.out or f"runs/rollout-{time.strftime('%Y%m%d-%H%M%S')}")
    job = RolloutJob(config=config, episodes=args.episodes, out_dir=out)
    return _stoppable(run_rollout(job), job, out)


def _rollout_config(args: argparse.Namespace, extra: list[str]) -> RunConfig:
    """The rollout's config: --config, the overrides, the flags. One episode per task
    (``rollout.group_size = 1``) unless one of them sets it; the env is checked (it is
    registered and takes its kwargs) before anything else is."""
    from agentrl.config import RunConfig
    from agentrl.env import check_env_config, import_env_modules
    from agentrl.errors import ConfigError

    overrides = _overrides(args, extra)
    if not _sets_group_size(args.config, overrides):  # not training's group size (8)
        overrides.insert(0, "--rollout.group_size=1")
    if args.env_id is not None:
        overrides.append(f"--env.id={json.dumps(args.env_id)}")
    if args.imports:
        overrides.append(f"--env.imports={json.dumps(args.imports)}")
    if args.server:
        overrides.append('--inference.mode="server"')
    config = RunConfig.load(args.config, overrides)
    if config.env.remote:  # its env servers answer (and name the env if env.id is empty)
        import dataclasses

        from agentrl.remote import check_servers

        config = dataclasses.replace(config, env=check_servers(config.env))
    if not config.env.id:
        raise ConfigError("give the env id to roll out (or --resume --out RUN_DIR)")
    import_env_modules(config.env.imports)
    check_env_config(config.env)  # an unknown env id is the first thing said
    return config


def _sets_group_size(config_file: str | None, overrides: list[str]) -> bool:
    """Whether the config file or an override (or --group-size) sets rollout.group_size."""
    import tomllib

    if any(o.startswith("--rollout.group_size=") for o in overrides):
        return True
    if config_file is None or not Path(config_file).is_file():
        return False  # a missing file is RunConfig.load's to report
    try:
        with open(config_file, "rb") as f:
            rollout = tomllib.load(f).get("rollout")
    except (OSError, tomllib.TOMLDecodeError):  # RunConfig.load says what is wrong
        return False
    return isinstance(rollout, dict) and "group_size" in rollout


def _stoppable(coro: Coroutine[Any, Any, dict[str, Any]], job: RolloutJob, out: Path) -> int:
    """Run the rollout; SIGTERM/SIGHUP stop it like Ctrl-C, with the resume command."""
    hint = f"continue with: agentrl rollout --resume --out {out}"
    try:
        summary = run_stoppable(
            coro,
            grace_s=job.config.run.stop_grace_s,
            on_hard_stop=lambda why: print(hint, file=sys.stderr),
        )
    except KeyboardInterrupt as e:
        print(f"{e if isinstance(e, Stopped) else 'interrupted'}; {hint}", file=sys.stderr)
        return e.exit_code if isinstance(e, Stopped) else 130
    return _print_rollout(summary, job.env_id, out)


def _print_rollout(summary: dict[str, object], env_id: str, out: object) -> int:
    metrics: dict[str, float] = summary["metrics"]  # type: ignore[assignment]
    lag = metrics.get("loop_lag_s/p99", float("nan"))
    resumed = metrics.get("episodes_resumed", 0)
    print(
        f"{summary['episodes']} episodes of {env_id}: success {summary['success_rate']:.1%}, "
        f"{summary['tokens_per_s']:,.0f} tokens/s, loop lag p99 {lag * 1000:.0f} ms"
        + (f", {resumed:.0f} episodes continued from checkpoints" if summary["resumed"] else "")
        + f"; written to {out}"
    )
    return 0


def _config(args: argparse.Namespace, extra: list[str]) -> int:
    from agentrl.config.reference import defaults_toml

    print(defaults_toml(), end="")
    return 0
