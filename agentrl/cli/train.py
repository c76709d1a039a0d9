"""``agentrl train``, ``agentrl serve`` and ``agentrl audit``: a run's job, its vLLM
servers, and the check that every task of it is accounted for."""

from __future__ import annotations

import argparse
import json
import os
import sys

from agentrl.cli.parsers import _checked_overrides
from agentrl.errors import AgentRLError


def _train(args: argparse.Namespace, extra: list[str]) -> int:
    from agentrl.run import explain_failure, prepare, train
    from agentrl.runtime.stopping import Stopped, ensure_reaper, run_stoppable
    from agentrl.status import Reporter
    from agentrl.trainer.distributed import launched_rank

    overrides = _checked_overrides(extra)
    rank, world = launched_rank()
    accelerator = None
    ranks = None
    if world == 1:  # on a Ray cluster this process may become rank 0 of several
        from agentrl.cluster.ranks import cluster_ranks

        if (ranks := cluster_ranks(args.config, overrides, resume=args.resume)) is not None:
            rank, world = launched_rank()
    if world > 1:
        from agentrl.trainer.distributed import follow_run, launched_config, start_distributed

        config, run_dir = launched_config(args.config, overrides, resume=args.resume)
        accelerator = start_distributed(config)
        if rank != 0:  # no vLLM, no store, no output: train on what rank 0 broadcasts
            follow_run(config, run_dir, resume=args.resume is not None, accelerator=accelerator)
            return 0
    reporter = Reporter()
    cfg, run_dir = prepare(args.config, overrides, resume=args.resume, reporter=reporter)
    ensure_reaper()  # nothing this run starts outlives it, even if it is SIGKILLed
    resume_hint = f"continue with: agentrl train --resume {run_dir}"
    released = False  # the rank actors, if any: rank 0 lets them go when its run ends
    try:
        result = run_stoppable(
            train(
                cfg,
                run_dir,
                resume=args.resume is not None,
                accelerator=accelerator,
                reporter=reporter,
                placement=ranks.placement if ranks is not None else None,
            ),
            grace_s=cfg.run.stop_grace_s,
            on_hard_stop=lambda why: print(resume_hint, file=sys.stderr),
        )
        released = True
    except KeyboardInterrupt as e:
        print(f"{e if isinstance(e, Stopped) else 'interrupted'}; {resume_hint}", file=sys.stderr)
        return e.exit_code if isinstance(e, Stopped) else 130
    except Exception as e:
        cause = explain_failure(e, run_dir)
        if cause is e and not isinstance(e, AgentRLError):
            raise
        raise cause from e
    finally:
        if ranks is not None:
            ranks.close(released=released)
    print(
        f"done: {result.steps} steps in {result.wall_s:.0f} s; run directory {run_dir} "
        f"(agentrl top {run_dir}, agentrl replay {run_dir}, plots in {run_dir}/plots)"
    )
    return 0


def _audit(args: argparse.Namespace, extra: list[str]) -> int:
    from agentrl.store import EpisodeStore

    with EpisodeStore.open(args.run_dir, create=False) as store:
        integrity = store.integrity_check()
        report = {"integrity_check": integrity, **store.audit()}
    report["ok"] = report["ok"] and integrity == "ok"
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        states = ", ".join(f"{n} {s}" for s, n in sorted(report["tasks_by_state"].items()))
        eps = ", ".join(f"{n} {s}" for s, n in sorted(report["episodes_by_state"].items()))
        print(f"store: integrity {integrity}; {report['tasks']} tasks ({states})")
        print(f"episodes: {eps or 'none'}; {report['partials']} paused with a checkpoint")
        print(
            f"trained: {report['trained_tasks']} tasks in steps 1..{report['consumed_steps']}; "
            f"resumable: {report['resumable_tasks']} tasks"
        )
        for key in ("lost", "trained_twice"):
            print(f"{key.replace('_', ' ')}: {len(report[key])}")
            for line in report[key][:20]:
                print(f"  {line}")
    return 0 if report["ok"] else 1


def _serve(args: argparse.Namespace, extra: list[str]) -> int:
    """Replace this process with `vllm serve` (so its PID is the server's)."""
    from agentrl.config import RunConfig
    from agentrl.inference.server import server_command
    from agentrl.models import resolve_model
    from agentrl.run import lora_rank

    cfg = RunConfig.load(args.config, extra)
    command, env = server_command(
        resolve_model(cfg.model.path),
        cfg.inference,
        args.port,
        args.host,
        seed=cfg.run.seed,
        max_lora_rank=lora_rank(cfg),
    )
    print(f"agentrl serve: {' '.join(command)}", flush=True)
    # vLLM handles SIGTERM itself (a graceful shutdown of its engine); the watchdog,
    # started before the exec, watches this PID (then vLLM's) and stops the engine
    # processes it leaves if it is SIGKILLed.
    from agentrl.runtime.stopping import ensure_reaper

    ensure_reaper()
    os.execve(command[0], command, env)
    return 0  # not reached
