"""agentrl: train LLM agents that use tools, with asynchronous reinforcement learning.

Episodes run against vLLM while the trainer learns from the finished ones; every
episode is recorded, so a killed run continues where it stopped and any episode can
be replayed. Start with:

    agentrl demo                             generate from a tiny model through real vLLM
    agentrl check-model MODEL                what agentrl finds in a model's chat template
    agentrl train CONFIG.toml [--key.sub=V]  the whole job: rollouts, training, evaluation
    agentrl train --resume RUN_DIR           continue a killed or interrupted run
    agentrl top RUN_DIR                      live view of a run (from another terminal)
    agentrl serve-env ENV_ID --port P        serve an env over OpenEnv (for [env] url)
    agentrl replay RUN_DIR [EPISODE]         list, show, verify, resume or fork episodes
    agentrl scan RUN_DIR                     health warnings and the episodes behind them
    agentrl view [RUNS_DIR]                  a web page of runs and episodes (local)
    agentrl eval MODEL_OR_RUN_DIR --env ID   pass@k and avg@k on held-out tasks
    agentrl export RUN_DIR --format F --out P  episodes as an Inspect log, ATIF or JSONL
    agentrl config --defaults                every config key with its default

``agentrl COMMAND --help`` describes each command.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Sequence

from agentrl.cli.check_model import _check_model
from agentrl.cli.eval import _eval
from agentrl.cli.export import _export
from agentrl.cli.misc import (
    DEMO_QUESTIONS,
    _build_model,
    _check_env,
    _plot,
    _run_demo,
    _top,
)
from agentrl.cli.parsers import (
    Subparsers,
    _audit_parser,
    _build_model_parser,
    _check_env_parser,
    _check_model_parser,
    _config_parser,
    _demo_parser,
    _eval_parser,
    _export_parser,
    _plot_parser,
    _replay_parser,
    _rollout_parser,
    _scan_parser,
    _serve_env_parser,
    _serve_parser,
    _top_parser,
    _train_parser,
    _view_parser,
)
from agentrl.cli.replay import _replay
from agentrl.cli.rollout import _config, _rollout
from agentrl.cli.scan import _scan
from agentrl.cli.serve_env import _serve_env
from agentrl.cli.train import _audit, _serve, _train
from agentrl.cli.view import _view
from agentrl.errors import AgentRLError

__all__ = ["COMMANDS", "DEMO_QUESTIONS", "main", "quiet_vllm"]

logger = logging.getLogger("agentrl")


@dataclasses.dataclass(frozen=True, slots=True)
class _Command:
    """One subcommand: how its parser is built and what runs it (returns the exit code)."""

    add_parser: Callable[[Subparsers], None]
    run: Callable[[argparse.Namespace, list[str]], int]
    overrides: bool = False
    """Whether it takes ``--section.key=value`` config overrides besides its flags."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``agentrl`` command; return its exit status."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    command = COMMANDS[args.command]
    if extra and not command.overrides:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        quiet_vllm()
    try:
        return command.run(args, extra)
    except AgentRLError as e:
        print(f"agentrl: error: {e}", file=sys.stderr)
        return 1
    finally:
        if not args.verbose:
            end_quietly()


_TEARDOWN = {"quiet": False}


def end_quietly() -> None:
    """Send what the interpreter prints while it tears down to /dev/null (for scripts
    that drive a run themselves, as the demo does: call it once the results are out)."""
    _TEARDOWN["quiet"] = True


def _quiet_teardown() -> None:
    """Once a command has ended, what the interpreter prints while it tears down goes
    nowhere: hundreds of "nanobind: leaked ..." lines from triton, imported by vLLM,
    would otherwise follow the results. Registered when this module is imported, before
    vLLM or torch register theirs, so it runs after every other atexit handler; only
    module teardown comes after it. ``agentrl -v`` keeps that output."""
    if not _TEARDOWN["quiet"]:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe, a closed stream
            stream.flush()
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)


atexit.register(_quiet_teardown)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentrl", description=__doc__.splitlines()[0])
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show vLLM's logs and what its processes print as they start "
        "(otherwise in the run's logs/vllm-engine.log)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.add_parser(commands)
    return parser


def quiet_vllm() -> None:
    """Show only vLLM's errors (call before vLLM is imported); an engine started after
    it writes its processes' start-up output to its log (agentrl.inference.quiet)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # vLLM then installs its own handler at that level, also in its engine process
    # (unconfigured, its warnings would reach stderr through Python's last resort).
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")
    logging.getLogger("vllm").setLevel(logging.ERROR)


COMMANDS: dict[str, _Command] = {
    "demo": _Command(_demo_parser, _run_demo),
    "build-model": _Command(_build_model_parser, _build_model),
    "check-env": _Command(_check_env_parser, _check_env),
    "check-model": _Command(_check_model_parser, _check_model),
    "rollout": _Command(_rollout_parser, _rollout, overrides=True),
    "eval": _Command(_eval_parser, _eval, overrides=True),
    "config": _Command(_config_parser, _config),
    "train": _Command(_train_parser, _train, overrides=True),
    "serve": _Command(_serve_parser, _serve, overrides=True),
    "serve-env": _Command(_serve_env_parser, _serve_env),
    "audit": _Command(_audit_parser, _audit),
    "top": _Command(_top_parser, _top),
    "plot": _Command(_plot_parser, _plot),
    "replay": _Command(_replay_parser, _replay),
    "scan": _Command(_scan_parser, _scan),
    "export": _Command(_export_parser, _export),
    "view": _Command(_view_parser, _view),
}
"""Every subcommand, in ``agentrl --help`` order."""
