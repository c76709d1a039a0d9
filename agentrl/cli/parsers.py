"""The argument parsers of the ``agentrl`` commands, one function per command.

The commands that read a run's folder have theirs in :mod:`agentrl.cli.run_parsers`;
the shared flags and the ``--section.key=value`` config overrides (:func:`_shortcut`,
:func:`_overrides`) are in :mod:`agentrl.cli.flags`. This module re-exports both. The
commands themselves live in the sibling modules; :mod:`agentrl.cli` pairs each parser
with its command.
"""

from __future__ import annotations

import json

from agentrl.cli.flags import Subparsers as Subparsers
from agentrl.cli.flags import _checked_overrides as _checked_overrides
from agentrl.cli.flags import _import_flag, _shortcut
from agentrl.cli.flags import _overrides as _overrides
from agentrl.cli.run_parsers import _audit_parser as _audit_parser
from agentrl.cli.run_parsers import _export_parser as _export_parser
from agentrl.cli.run_parsers import _plot_parser as _plot_parser
from agentrl.cli.run_parsers import _replay_parser as _replay_parser
from agentrl.cli.run_parsers import _scan_parser as _scan_parser
from agentrl.cli.run_parsers import _top_parser as _top_parser
from agentrl.cli.run_parsers import _view_parser as _view_parser


def _demo_parser(commands: Subparsers) -> None:
    demo = commands.add_parser("demo", help="generate from the tiny model through real vLLM")
    demo.add_argument("--model", default="tiny", help="'tiny', a model folder, or a hub name")
    demo.add_argument("--server", action="store_true", help="go through `vllm serve` over HTTP")
    demo.add_argument("--max-tokens", type=int, default=48)


def _build_model_parser(commands: Subparsers) -> None:
    build = commands.add_parser("build-model", help="build the tiny model and print its folder")
    build.add_argument("--cache-dir", default=None)


def _check_env_parser(commands: Subparsers) -> None:
    check = commands.add_parser("check-env", help="run Gymnasium's and agentrl's env checks")
    check.add_argument("env_id", help="a registered id, e.g. agentrl/Calculator-v0")
    _import_flag(check, "import this module or .py file first (where your env registers itself)")
    check.add_argument(
        "--example-action",
        dest="example_actions",
        action="append",
        default=[],
        metavar="TEXT",
        help="a move the env accepts, e.g. 'reveal 3 4' "
        "(repeatable): explored from, with its numbers varied; an env may list "
        "its own in an example_actions attribute",
    )
    check.add_argument(
        "--kwargs",
        type=json.loads,
        default={},
        metavar="JSON",
        help="keyword arguments for the env, e.g. '{\"high\": 30}'",
    )


def _check_model_parser(commands: Subparsers) -> None:
    check = commands.add_parser(
        "check-model",
        help="what agentrl finds in a model's chat template (tool calls, thinking, prefix)",
    )
    check.add_argument("model", help="'tiny', a model folder, or a hub name")
    check.add_argument("--tool-format", default="auto", help="as model.tool_format")
    check.add_argument("--reasoning", default="auto", help="as model.reasoning")
    check.add_argument("--keep-thinking", action="store_true", help="as model.keep_thinking")


def _rollout_parser(commands: Subparsers) -> None:
    roll = commands.add_parser(
        "rollout",
        help="run an env against a model for N episodes and record them",
        description="Run N episodes and record them in a run directory (no training). "
        "Settings come from the same config tree as `agentrl train` ([model], [env], "
        "[inference], [rollout]): a TOML file with --config, then --section.key=value "
        "overrides (e.g. --inference.max_model_len=2048), then the shortcut flags below. "
        "Defaults: `agentrl config --defaults`.",
    )
    roll.add_argument("env_id", nargs="?", help="a registered id, e.g. agentrl/GuessNumber-v0")
    roll.add_argument(
        "--config",
        default=None,
        metavar="TOML",
        help="a config file; its [model], [env], [inference] and [rollout] apply",
    )
    roll.add_argument(
        "--episodes",
        type=int,
        default=64,
        metavar="N",
        help="episodes to run (default 64), a multiple of --group-size",
    )
    _shortcut(roll, "--model", "model.path", str, "'tiny', a model folder, or a hub name")
    roll.add_argument(
        "--group-size",
        type=int,
        default=None,
        dest="key:rollout.group_size",
        metavar="N",
        help="episodes per task, sharing its seed (sets "
        "rollout.group_size; default 1 here, unless --config sets it)",
    )
    _shortcut(roll, "--concurrency", "rollout.concurrency", int, "episodes running at once")
    _shortcut(roll, "--max-turns", "rollout.max_turns", int, "assistant turns per episode")
    _shortcut(roll, "--max-tokens", "rollout.max_tokens_per_turn", int, "per assistant turn")
    _shortcut(roll, "--temperature", "rollout.temperature", float, "sampling temperature")
    _shortcut(
        roll,
        "--workers",
        "rollout.workers",
        int,
        "processes that run the episodes (default 1: this one)",
    )
    _shortcut(roll, "--max-model-len", "inference.max_model_len", int, "context window")
    _shortcut(roll, "--seed", "env.first_seed", int, "seed of the first task")
    roll.add_argument(
        "--server",
        action="store_true",
        help='go through `vllm serve` over HTTP (inference.mode = "server")',
    )
    roll.add_argument("--out", default=None, help="run directory (default runs/rollout-TIME)")
    roll.add_argument(
        "--resume",
        action="store_true",
        help="continue the killed or interrupted run in --out with its recorded settings",
    )
    _import_flag(roll, "import this first (registers your env; recorded as env.imports)")


def _eval_parser(commands: Subparsers) -> None:
    ev = commands.add_parser(
        "eval",
        help="score a model or a trained run on held-out tasks: pass@k, avg@k, per-task results",
        description="Run N held-out tasks x k samples through the same scheduler and runner as "
        "training (nothing trained), record every episode in --out (agentrl replay works on "
        "it; a killed eval continues with --resume) and write results.json. MODEL may be the "
        "run directory of `agentrl train`: its final model (or --step S) and its config are "
        "used. Settings: --config TOML, then --section.key=value overrides, then the flags.",
    )
    ev.add_argument(
        "model",
        nargs="?",
        metavar="MODEL_OR_RUN_DIR",
        help="'tiny', a model folder, a hub name, or a train run directory",
    )
    ev.add_argument("--env", default=None, metavar="ID", help="the env id (default: the run's)")
    ev.add_argument("--config", default=None, metavar="TOML", help="a config file")
    _shortcut(ev, "--episodes", "eval.episodes", int, "held-out tasks (N)")
    _shortcut(ev, "-k", "eval.k", int, "samples per task (pass@k, avg@k)")
    _shortcut(ev, "--seed", "eval.first_seed", int, "seed of the first task")
    _shortcut(ev, "--temperature", "eval.temperature", float, "sampling temperature")
    _shortcut(ev, "--concurrency", "rollout.concurrency", int, "episodes running at once")
    _shortcut(ev, "--max-turns", "rollout.max_turns", int, "assistant turns per episode")
    _shortcut(ev, "--max-tokens", "rollout.max_tokens_per_turn", int, "per assistant turn")
    ev.add_argument(
        "--step",
        type=int,
        default=None,
        help="a run directory's checkpoint of this step instead of its final model",
    )
    ev.add_argument("--out", default=None, help="eval directory (default runs/eval-TIME)")
    ev.add_argument(
        "--resume", action="store_true", help="continue the killed or interrupted eval in --out"
    )
    _import_flag(ev, "import this first (registers your env; recorded as env.imports)")


def _config_parser(commands: Subparsers) -> None:
    cfg_cmd = commands.add_parser(
        "config", help="print the config reference: every key, its default and what it does"
    )
    cfg_cmd.add_argument(
        "--defaults",
        action="store_true",
        help="print every key with its default, as TOML with comments",
    )


def _train_parser(commands: Subparsers) -> None:
    train = commands.add_parser(
        "train",
        help="train an agent: agentrl train CONFIG.toml [--section.key=value ...]",
        description="Run the job a TOML config describes (every key, its default and what it "
        "does: `agentrl config --defaults`). "
        'Overrides: --section.key=value, the value read as TOML (3e-4, true, "text").',
    )
    train.add_argument("config", nargs="?", help="the run's TOML config")
    train.add_argument(
        "--resume",
        metavar="RUN_DIR",
        default=None,
        help="continue the run in RUN_DIR with its recorded config",
    )


def _serve_parser(commands: Subparsers) -> None:
    serve = commands.add_parser(
        "serve",
        help="run `vllm serve` with the settings a config's runs need (for inference.servers)",
        description="Start vLLM's OpenAI server in the foreground with the flags agentrl's "
        "client needs (weight-update routes, LoRA updates, sampling logprobs), the model and "
        "engine settings taken from CONFIG's [model] and [inference]. Overrides as for train.",
    )
    serve.add_argument("config", nargs="?", help="the run's TOML config (default: defaults)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; the weight-update routes "
        "are unauthenticated: expose them only on a private network)",
    )


def _serve_env_parser(commands: Subparsers) -> None:
    serve = commands.add_parser(
        "serve-env",
        help="serve a registered env over the OpenEnv protocol (for [env] url/urls)",
        description="Serve ENV_ID to OpenEnv clients (agentrl's [env] url/urls, or openenv-core's "
        "own clients): GET /health, /metadata, /schema; POST /reset, /step; WebSocket /ws with "
        "one env instance per session (reset, step, state, set_state, MCP tools/list and "
        "tools/call). Runs in the foreground until SIGINT or SIGTERM.",
    )
    serve.add_argument("env_id", help="a registered id, e.g. agentrl/GuessNumber-v0")
    _import_flag(serve, "import this module or .py file first (where your env registers itself)")
    serve.add_argument("--port", type=int, default=8100)
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; 0.0.0.0 for trainers on other "
        "machines: the protocol is unauthenticated, keep it on a private "
        "network)",
    )
    serve.add_argument(
        "--kwargs",
        type=json.loads,
        default={},
        metavar="JSON",
        help="keyword arguments for each session's env, e.g. '{\"high\": 50}'",
    )
    serve.add_argument(
        "--max-sessions",
        type=int,
        default=512,
        help="sessions at once (each holds an env instance); default 512",
    )
    serve.add_argument(
        "--idle-timeout-s",
        type=float,
        default=600.0,
        help="close a session with no message for this long (default 600)",
    )
    serve.add_argument(
        "--env-timeout-s",
        type=float,
        default=300.0,
        help="deadline for one make, reset, step or set_state (default 300)",
    )
    serve.add_argument(
        "--tool-timeout-s",
        type=float,
        default=300.0,
        help="deadline for one tool call on the server (default 300; the "
        "trainer's rollout.tool_timeout_s applies too)",
    )
