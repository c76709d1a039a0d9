"""The parsers of the commands that read a run's folder: ``audit``, ``top``, ``plot``,
``replay``, ``scan``, ``export`` and ``view``. :mod:`agentrl.cli.parsers` re-exports them.
"""

from __future__ import annotations

from agentrl.cli.flags import Subparsers, _import_flag


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
