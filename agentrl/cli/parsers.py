"""The argument parsers of the ``agentrl`` commands, one function per command.

Also the ``--section.key=value`` config overrides: :func:`_shortcut` makes a flag that
sets one config key, :func:`_overrides` turns the overrides and those flags into the
list :meth:`agentrl.config.RunConfig.load` reads. The commands themselves live in the
sibling modules; :mod:`agentrl.cli` pairs each parser with its command.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
else:
    Subparsers = Any


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


def _audit_parser(commands: Subparsers) -> None:
    audit = commands.add_parser(
        "audit",
        help="account for every task of a run: finished, failed with a reason, or resumable; "
        "exit 1 if anything was lost or trained twice",
    )
    audit.add_argument("run_dir")
    audit.add_argument("--json", action="store_true", help="print the audit as JSON")


def _top_parser(commands: Subparsers) -> None:
    top_cmd = commands.add_parser("top", help="live view of a run (from another terminal)")
    top_cmd.add_argument("run_dir")
    top_cmd.add_argument("--once", action="store_true", help="print one view and exit")


def _plot_parser(commands: Subparsers) -> None:
    plot = commands.add_parser("plot", help="write the run's PNG plots from metrics.jsonl")
    plot.add_argument("run_dir")


def _replay_parser(commands: Subparsers) -> None:
    replay = commands.add_parser(
        "replay",
        help="list, show, verify, resume, fork or export recorded episodes",
        description="Without EPISODE: list the run's episodes (filters apply). With EPISODE: "
        "show its transcript, or --verify / --resume / --fork-at it.",
    )
    replay.add_argument("run_dir", help="a run directory (holds episodes.db)")
    replay.add_argument("episode", nargs="?", help="an episode id from the list")
    replay.add_argument("--attempt", type=int, default=None, help="default: the latest")
    replay.add_argument(
        "--state",
        action="append",
        default=None,
        help="filter: finished, truncated, failed, running, paused, retried, dropped (repeatable)",
    )
    replay.add_argument("--env", default=None, help="filter: env id")
    replay.add_argument("--min-reward", type=float, default=None)
    replay.add_argument("--max-reward", type=float, default=None)
    replay.add_argument(
        "--min-version-span",
        type=int,
        default=None,
        help="filter: sampled tokens span at least this many versions",
    )
    replay.add_argument("--limit", type=int, default=None)
    action = replay.add_mutually_exclusive_group()
    action.add_argument(
        "--verify",
        action="store_true",
        help="replay the env from the seed with the recorded actions",
    )
    action.add_argument(
        "--resume",
        action="store_true",
        help="continue an unfinished episode; stored as a new episode",
    )
    action.add_argument(
        "--fork-at",
        type=int,
        default=None,
        metavar="TURN",
        help="branch at assistant turn TURN; show both endings",
    )
    action.add_argument(
        "--export",
        default=None,
        metavar="FILE.jsonl",
        help="write the episode (or the filtered list) as JSONL",
    )
    replay.add_argument(
        "--model",
        default=None,
        help="for --resume/--fork-at: 'tiny', a model folder or a hub name "
        "(default: the policy that sampled the episode: its checkpoint, else "
        "the run's final model)",
    )
    _import_flag(
        replay,
        "import this first (registers your env); the run's recorded env.imports are imported too",
    )
    replay.add_argument("--temperature", type=float, default=None)
    replay.add_argument("--max-tokens", type=int, default=None, help="per assistant turn")


def _scan_parser(commands: Subparsers) -> None:
    scan = commands.add_parser(
        "scan",
        help="health rules over a run's metrics and detectors over its episodes (read-only)",
        description="Replay the health rules over metrics.jsonl and run per-episode detectors "
        "(repeated_text, reward_without_success, extreme_length, answer_leak, reward_jump) "
        "over the episode store; list the flagged episodes with `agentrl replay` commands. "
        "See docs/guides/health.md.",
    )
    scan.add_argument("run_dir", help="a run directory (holds episodes.db)")
    scan.add_argument(
        "--detector",
        action="append",
        default=None,
        metavar="MODULE:FUNCTION",
        help="also run this function (episode, context) -> reason or None; "
        "MODULE may be a .py file (repeatable)",
    )
    scan.add_argument(
        "--only",
        action="append",
        default=None,
        metavar="NAME",
        help="run only these built-in detectors (repeatable)",
    )
    scan.add_argument(
        "--skip",
        action="append",
        default=None,
        metavar="NAME",
        help="leave out this built-in detector (repeatable)",
    )
    scan.add_argument("--limit", type=int, default=50, help="flagged episodes printed")
    scan.add_argument("--json", action="store_true", help="print the report as JSON")


def _export_parser(commands: Subparsers) -> None:
    export = commands.add_parser(
        "export",
        help="write a run's episodes as an Inspect log, ATIF trajectories or JSONL",
        description="Stream the run's episodes (the filters of `agentrl replay`) into a file "
        "other tools read: --format inspect writes a folder of Inspect AI .eval logs "
        "(`inspect view --log-dir` opens it), atif one ATIF trajectory per line with token "
        "ids, logprobs and policy versions, jsonl agentrl's loss-free records. inspect and "
        "atif need `pip install 'agentrl[export]'`.",
    )
    export.add_argument("run_dir", help="a run directory (holds episodes.db)")
    export.add_argument("--format", required=True, choices=("inspect", "atif", "jsonl"))
    export.add_argument(
        "--out",
        required=True,
        metavar="PATH",
        help="the file to write (inspect: a folder that gets RUN_NAME-0001.eval, "
        "... a log per 1000 episodes); missing folders are created",
    )
    export.add_argument(
        "--state",
        action="append",
        default=None,
        help="filter: finished, truncated, failed, running, paused, retried, dropped (repeatable)",
    )
    export.add_argument("--env", default=None, help="filter: env id")
    export.add_argument("--min-reward", type=float, default=None)
    export.add_argument("--max-reward", type=float, default=None)
    export.add_argument(
        "--min-version-span",
        type=int,
        default=None,
        help="filter: sampled tokens span at least this many versions",
    )
    export.add_argument(
        "--limit",
        type=int,
        default=None,
        help="at most this many episodes (in the order they started)",
    )


def _import_flag(parser: argparse.ArgumentParser, text: str) -> None:
    """``--import MODULE_OR_FILE`` (repeatable): modules that register the user's envs."""
    parser.add_argument(
        "--import", dest="imports", action="append", default=[], metavar="MODULE_OR_FILE", help=text
    )


def _shortcut(parser: argparse.ArgumentParser, flag: str, key: str, kind: type, text: str) -> None:
    """A flag that sets one config key; its default is the config tree's."""
    from agentrl.config.reference import default_of

    metavar = {int: "N", float: "X"}.get(kind, flag.lstrip("-").upper())  # not dest's KEY:...
    parser.add_argument(
        flag,
        type=kind,
        default=None,
        dest=f"key:{key}",
        metavar=metavar,
        help=f"{text} (sets {key}; default {default_of(key)!r})",
    )


def _checked_overrides(extra: Sequence[str]) -> list[str]:
    """The ``--section.key=value`` overrides, refusing anything else."""
    from agentrl.errors import ConfigError

    bad = [o for o in extra if not o.startswith("--") or "=" not in o]
    if bad:
        raise ConfigError(
            f"unrecognized argument {bad[0]!r}; overrides look like --section.key=value"
        )
    return list(extra)


def _overrides(args: argparse.Namespace, extra: Sequence[str]) -> list[str]:
    """``--section.key=value`` overrides, then the shortcut flags given."""
    flags = [
        f"--{k[4:]}={json.dumps(v)}"
        for k, v in vars(args).items()
        if k.startswith("key:") and v is not None
    ]
    return [*_checked_overrides(extra), *flags]


def _view_parser(commands: Subparsers) -> None:
    view = commands.add_parser(
        "view",
        help="a web page of runs and episodes (local; read-only)",
        description="Serve a web page of the runs under a folder (or one run directory): "
        "metrics, episodes with filters, each episode's transcript and tokens coloured by "
        "policy version, and in-flight episodes of a running train. Binds 127.0.0.1; "
        "another --host needs the token printed in the URL. Never writes to the runs.",
    )
    view.add_argument(
        "root",
        nargs="?",
        default="runs",
        help="a run directory, or a folder of them (default: runs)",
    )
    view.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    view.add_argument(
        "--host", default="127.0.0.1", help="address to bind; not loopback: a token is required"
    )
    view.add_argument("--no-browser", action="store_true", help="do not open a browser")
    view.add_argument(
        "--allow-fork",
        action="store_true",
        help="the page may start forks (`agentrl replay --fork-at`, an inference "
        "engine each); a fork is stored in its run's episodes.db",
    )
    view.add_argument(
        "--bundle",
        default=None,
        metavar="OUT",
        help="write a static site to OUT/ (opens from disk)",
    )
    view.add_argument(
        "--max-episodes",
        type=int,
        default=None,
        help="with --bundle: at most this many per run (newest)",
    )
    view.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --bundle: only matching episodes (state, env, "
        "min_reward, max_reward, min_version_span, failure, attempt, "
        "origin); repeatable",
    )
