"""The ``agentrl`` command line: wiring only, no logic.

Commands:
    agentrl demo [--server] [--model SPEC]   build the tiny model, generate through real vLLM
    agentrl build-model [--cache-dir DIR]    build (or find) the tiny model, print its folder
    agentrl train CONFIG.toml [--key.sub=V]  the whole job: rollouts, training, evaluation
    agentrl train --resume RUN_DIR           continue a killed or interrupted run
    agentrl top RUN_DIR                      live view of a run's in-flight episodes
    agentrl plot RUN_DIR                     (re)write the run's PNG plots

This is the only place that calls ``asyncio.run``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Sequence

from agentrl.errors import AgentRLError

logger = logging.getLogger("agentrl")

DEMO_QUESTIONS = ("What is 47 * 38?", "What is 512 + 89?", "What is 903 - 417?")
CALCULATOR_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 47*38"}},
            "required": ["expression"],
        },
    },
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentrl", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="show vLLM's logs")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="generate from the tiny model through real vLLM")
    demo.add_argument("--model", default="tiny", help="'tiny', a model folder, or a hub name")
    demo.add_argument("--server", action="store_true", help="go through `vllm serve` over HTTP")
    demo.add_argument("--max-tokens", type=int, default=48)

    build = commands.add_parser("build-model", help="build the tiny model and print its folder")
    build.add_argument("--cache-dir", default=None)

    check = commands.add_parser("check-env", help="run Gymnasium's and agentrl's env checks")
    check.add_argument("env_id", help="a registered id, e.g. agentrl/Calculator-v0")
    check.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE_OR_FILE",
        help="import this module or .py file first (where your env registers itself)",
    )

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
    roll.add_argument("--config", default=None, metavar="TOML",
                      help="a config file; its [model], [env], [inference] and [rollout] "
                      "apply")  # fmt: skip
    roll.add_argument("--episodes", type=int, default=64)
    _shortcut(roll, "--model", "model.path", str, "'tiny', a model folder, or a hub name")
    _shortcut(roll, "--group-size", "rollout.group_size", int, "episodes per task (same seed)")
    _shortcut(roll, "--concurrency", "rollout.concurrency", int, "episodes running at once")
    _shortcut(roll, "--max-turns", "rollout.max_turns", int, "assistant turns per episode")
    _shortcut(roll, "--max-tokens", "rollout.max_tokens_per_turn", int, "per assistant turn")
    _shortcut(roll, "--temperature", "rollout.temperature", float, "sampling temperature")
    _shortcut(roll, "--max-model-len", "inference.max_model_len", int, "context window")
    _shortcut(roll, "--seed", "env.first_seed", int, "seed of the first task")
    roll.add_argument("--server", action="store_true",
                      help="go through `vllm serve` over HTTP "
                      '(inference.mode = "server")')  # fmt: skip
    roll.add_argument("--out", default=None, help="run directory (default runs/rollout-TIME)")
    roll.add_argument(
        "--resume",
        action="store_true",
        help="continue the killed or interrupted run in --out with its recorded settings",
    )
    roll.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE_OR_FILE",
        help="import this first (registers your env; recorded as env.imports)",
    )

    cfg_cmd = commands.add_parser(
        "config", help="print the config reference: every key, its default and what it does"
    )
    cfg_cmd.add_argument("--defaults", action="store_true",
                         help="print every key with its default, as TOML with "
                         "comments")  # fmt: skip

    train = commands.add_parser(
        "train",
        help="train an agent: agentrl train CONFIG.toml [--section.key=value ...]",
        description="Run the job a TOML config describes (see agentrl/config.py for every key). "
        'Overrides: --section.key=value, the value read as TOML (3e-4, true, "text").',
    )
    train.add_argument("config", nargs="?", help="the run's TOML config")
    train.add_argument("--resume", metavar="RUN_DIR", default=None,
                       help="continue the run in RUN_DIR with its recorded config")  # fmt: skip

    serve = commands.add_parser(
        "serve",
        help="run `vllm serve` with the settings a config's runs need (for inference.servers)",
        description="Start vLLM's OpenAI server in the foreground with the flags agentrl's "
        "client needs (weight-update routes, LoRA updates, sampling logprobs), the model and "
        "engine settings taken from CONFIG's [model] and [inference]. Overrides as for train.",
    )
    serve.add_argument("config", nargs="?", help="the run's TOML config (default: defaults)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to bind (default 127.0.0.1; the weight-update routes "
                       "are unauthenticated: expose them only on a private network)")  # fmt: skip

    audit = commands.add_parser(
        "audit",
        help="account for every task of a run: finished, failed with a reason, or resumable; "
        "exit 1 if anything was lost or trained twice",
    )
    audit.add_argument("run_dir")
    audit.add_argument("--json", action="store_true", help="print the audit as JSON")

    top_cmd = commands.add_parser("top", help="live view of a run (from another terminal)")
    top_cmd.add_argument("run_dir")
    top_cmd.add_argument("--once", action="store_true", help="print one view and exit")

    plot = commands.add_parser("plot", help="write the run's PNG plots from metrics.jsonl")
    plot.add_argument("run_dir")

    replay = commands.add_parser(
        "replay",
        help="list, show, verify, resume, fork or export recorded episodes",
        description="Without EPISODE: list the run's episodes (filters apply). With EPISODE: "
        "show its transcript, or --verify / --resume / --fork-at it.",
    )
    replay.add_argument("run_dir", help="a run directory (holds episodes.db)")
    replay.add_argument("episode", nargs="?", help="an episode id from the list")
    replay.add_argument("--attempt", type=int, default=None, help="default: the latest")
    replay.add_argument("--state", action="append", default=None,
                        help="filter: finished, truncated, failed, running, paused, retried, "
                        "dropped (repeatable)")  # fmt: skip
    replay.add_argument("--env", default=None, help="filter: env id")
    replay.add_argument("--min-reward", type=float, default=None)
    replay.add_argument("--max-reward", type=float, default=None)
    replay.add_argument("--min-version-span", type=int, default=None,
                        help="filter: sampled tokens span at least this many versions")  # fmt: skip
    replay.add_argument("--limit", type=int, default=None)
    action = replay.add_mutually_exclusive_group()
    action.add_argument("--verify", action="store_true",
                        help="replay the env from the seed with the recorded actions")  # fmt: skip
    action.add_argument("--resume", action="store_true",
                        help="continue an unfinished episode; stored as a new episode")  # fmt: skip
    action.add_argument("--fork-at", type=int, default=None, metavar="TURN",
                        help="branch at assistant turn TURN; show both endings")  # fmt: skip
    action.add_argument("--export", default=None, metavar="FILE.jsonl",
                        help="write the episode (or the filtered list) as JSONL")  # fmt: skip
    replay.add_argument("--model", default=None, help="for --resume/--fork-at (default: the run's)")
    replay.add_argument("--temperature", type=float, default=None)
    replay.add_argument("--max-tokens", type=int, default=None, help="per assistant turn")

    args, extra = parser.parse_known_args(argv)
    if extra and args.command not in ("train", "serve", "rollout"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        quiet_vllm()
    try:
        if args.command == "build-model":
            from agentrl.models.tiny import build_tiny_model

            print(build_tiny_model(cache_dir=args.cache_dir))
        elif args.command == "demo":
            asyncio.run(_demo(args.model, args.server, args.max_tokens))
        elif args.command == "check-env":
            return _check_env(args.env_id, args.imports)
        elif args.command == "rollout":
            return _rollout(args, extra)
        elif args.command == "config":
            from agentrl.config.reference import defaults_toml

            print(defaults_toml(), end="")
        elif args.command == "replay":
            return _replay(args)
        elif args.command == "train":
            return _train(args.config, extra, args.resume)
        elif args.command == "audit":
            return _audit(args.run_dir, args.json)
        elif args.command == "serve":
            return _serve(args.config, extra, args.port, args.host)
        elif args.command == "top":
            from pathlib import Path

            from agentrl.monitor import top

            return top(Path(args.run_dir), once=args.once)
        elif args.command == "plot":
            from agentrl.plots import write_plots

            for path in write_plots(args.run_dir):
                print(path)
    except AgentRLError as e:
        print(f"agentrl: error: {e}", file=sys.stderr)
        return 1
    return 0


def quiet_vllm() -> None:
    """Show only vLLM's errors (call before vLLM is imported)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # vLLM then installs its own handler at that level, also in its engine process
    # (unconfigured, its warnings would reach stderr through Python's last resort).
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")
    logging.getLogger("vllm").setLevel(logging.ERROR)


def _train(config: str | None, overrides: list[str], resume: str | None) -> int:
    from pathlib import Path

    from agentrl.errors import ConfigError
    from agentrl.run import explain_failure, follow, launched_rank, make_accelerator, prepare, train

    bad = [o for o in overrides if not o.startswith("--") or "=" not in o]
    if bad:
        raise ConfigError(
            f"unrecognized argument {bad[0]!r}; overrides look like --section.key=value"
        )
    rank, world = launched_rank()
    accelerator = None
    if world > 1:
        from agentrl.config import RunConfig

        if resume is None and not RunConfig.load(config, overrides).run.out:
            raise ConfigError(
                "a run launched on several processes needs run.out (all ranks must agree "
                "on the run directory): add --run.out=DIR"
            )
        from agentrl.models import resolve_model

        # Build the tiny model (if asked for) before torch.distributed starts: once it
        # has, transformers writes model files only on rank 0.
        recorded = Path(resume) / "config.toml" if resume is not None else config
        resolve_model(RunConfig.load(recorded, overrides).model.path)
        accelerator = make_accelerator()
        if rank != 0:  # no vLLM, no store, no output: train on what rank 0 broadcasts
            if resume is not None:
                cfg = RunConfig.load(Path(resume) / "config.toml", overrides)
                follow(cfg, Path(resume), True, accelerator)
            else:
                cfg = RunConfig.load(config, overrides)
                follow(cfg, Path(cfg.run.out), False, accelerator)
            return 0
    cfg, run_dir = prepare(config, overrides, resume=resume)
    try:
        result = asyncio.run(train(cfg, run_dir, resume=resume is not None,
                                   accelerator=accelerator))  # fmt: skip
    except KeyboardInterrupt:
        print(f"interrupted; continue with: agentrl train --resume {run_dir}", file=sys.stderr)
        return 130
    except Exception as e:
        cause = explain_failure(e, run_dir)
        if cause is e and not isinstance(e, AgentRLError):
            raise
        raise cause from e
    print(
        f"done: {result.steps} steps in {result.wall_s:.0f} s; run directory {run_dir} "
        f"(agentrl top {run_dir}, agentrl replay {run_dir}, plots in {run_dir}/plots)"
    )
    return 0


def _audit(run_dir: str, as_json: bool) -> int:
    import json

    from agentrl.store import EpisodeStore

    with EpisodeStore.open(run_dir, create=False) as store:
        integrity = store.integrity_check()
        report = {"integrity_check": integrity, **store.audit()}
    report["ok"] = report["ok"] and integrity == "ok"
    if as_json:
        print(json.dumps(report, indent=1))
    else:
        states = ", ".join(f"{n} {s}" for s, n in sorted(report["tasks_by_state"].items()))
        eps = ", ".join(f"{n} {s}" for s, n in sorted(report["episodes_by_state"].items()))
        print(f"store: integrity {integrity}; {report['tasks']} tasks ({states})")
        print(f"episodes: {eps or 'none'}; {report['partials']} paused with a checkpoint")
        print(f"trained: {report['trained_tasks']} tasks in steps 1..{report['consumed_steps']}; "
              f"resumable: {report['resumable_tasks']} tasks")  # fmt: skip
        for key in ("lost", "trained_twice"):
            print(f"{key.replace('_', ' ')}: {len(report[key])}")
            for line in report[key][:20]:
                print(f"  {line}")
    return 0 if report["ok"] else 1


def _serve(config: str | None, overrides: list[str], port: int, host: str) -> int:
    """Replace this process with `vllm serve` (so its PID is the server's)."""
    from agentrl.config import RunConfig
    from agentrl.inference.server import server_command
    from agentrl.models import resolve_model
    from agentrl.run import lora_rank

    cfg = RunConfig.load(config, overrides)
    command, env = server_command(resolve_model(cfg.model.path), cfg.inference, port, host,
                                  seed=cfg.run.seed, max_lora_rank=lora_rank(cfg))  # fmt: skip
    print(f"agentrl serve: {' '.join(command)}", flush=True)
    os.execve(command[0], command, env)
    return 0  # not reached


def _shortcut(parser: argparse.ArgumentParser, flag: str, key: str, kind: type,
              text: str) -> None:  # fmt: skip
    """A flag that sets one config key; its default is the config tree's."""
    from agentrl.config.reference import default_of

    parser.add_argument(flag, type=kind, default=None, dest=f"key:{key}",
                        help=f"{text} (sets {key}; default {default_of(key)!r})")  # fmt: skip


def _overrides(args: argparse.Namespace, extra: Sequence[str]) -> list[str]:
    """``--section.key=value`` overrides, then the shortcut flags given."""
    from agentrl.errors import ConfigError

    bad = [o for o in extra if not o.startswith("--") or "=" not in o]
    if bad:
        raise ConfigError(
            f"unrecognized argument {bad[0]!r}; overrides look like --section.key=value"
        )
    flags = [f"--{k[4:]}={json.dumps(v)}" for k, v in vars(args).items()
             if k.startswith("key:") and v is not None]  # fmt: skip
    return [*extra, *flags]


def _rollout(args: argparse.Namespace, extra: Sequence[str]) -> int:
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


def _replay(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    from agentrl import replay
    from agentrl.errors import ConfigError
    from agentrl.store import EpisodeStore

    # wide enough when piped, so ids and reasons are not folded
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 220)
    with EpisodeStore.open(Path(args.run_dir), create=False) as store:
        filters = dict(state=args.state, env_id=args.env, min_reward=args.min_reward,
                       max_reward=args.max_reward, min_version_span=args.min_version_span,
                       limit=args.limit)  # fmt: skip
        if args.episode is None:
            if args.export:
                n = replay.export(store, Path(args.export), **filters)
                print(f"wrote {n} episodes to {args.export}")
            elif args.verify or args.resume or args.fork_at is not None:
                raise ConfigError("--verify, --resume and --fork-at need an EPISODE id")
            else:
                console.print(replay.list_episodes(store, **filters))
            return 0
        recorded = replay.load(store, args.episode, args.attempt)
        settings = next((r["config"] for r in store.runs()), {})
        model = args.model or settings.get("model", "tiny")
        if args.export:
            replay.export(store, Path(args.export), only=[recorded])
            print(f"wrote {args.episode} (attempt {recorded.attempt}) to {args.export}")
            return 0
        if args.verify:
            result = replay.verify(recorded)
            if result.difference is None:
                print(f"{args.episode}: reset and {result.steps} steps replayed from seed "
                      f"{recorded.task.seed}; every observation, reward and end flag "
                      "matches")  # fmt: skip
                return 0
            print(f"{args.episode}: differs at {result.difference}")
            return 1
        tokenizer = _tokenizer(model)
        sampling = dict(
            model=model,
            temperature=args.temperature if args.temperature is not None
            else settings.get("temperature", 1.0),
            max_tokens=args.max_tokens or settings.get("max_tokens_per_turn", 64),
            max_turns=settings.get("max_turns", 8),
        )  # fmt: skip
        if args.resume:
            if recorded.partial is None:
                raise ConfigError(
                    f"{args.episode} already ended ({recorded.state}); --resume continues "
                    f"unfinished episodes; use --fork-at TURN to branch an ended one"
                )
            new_id = replay.new_episode_id(store, f"{args.episode}~resumed")
            done = asyncio.run(replay.continue_episode(store, recorded.partial, new_id,
                                                       **sampling))  # fmt: skip
            console.print(replay.transcript(done, tokenizer))
            print(f"stored as {new_id}")
            return 0
        if args.fork_at is not None:
            point = replay.fork_point(recorded, args.fork_at)
            new_id = replay.new_episode_id(store, f"{args.episode}~fork@{args.fork_at}")
            fork = asyncio.run(replay.continue_episode(store, point, new_id, **sampling))
            title = (f"fork at turn {args.fork_at}: {model}, temperature "
                     f"{sampling['temperature']}")  # fmt: skip
            console.print(replay.side_by_side(recorded, fork, args.fork_at, tokenizer, title))
            print(f"stored as {new_id}")
            return 0
        console.print(replay.transcript(recorded, _tokenizer(model)))
    return 0


def _tokenizer(model: str) -> object:
    from transformers import AutoTokenizer

    from agentrl.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(model))


def _check_env(env_id: str, imports: Sequence[str]) -> int:
    from agentrl.check import check_env
    from agentrl.env import import_env_modules, load_env_plugins

    load_env_plugins()
    import_env_modules(imports, key="--import")
    results = check_env(env_id, raise_on_failure=False)
    for r in results:
        print(f"{'PASS' if r.passed else 'FAIL'}  {r.rule:<20} {'' if r.passed else r.detail}")
    failed = [r.rule for r in results if not r.passed]
    print(
        f"{env_id}: "
        + (f"{len(failed)} rule(s) failed: {', '.join(failed)}" if failed else "all rules passed")
    )
    return 1 if failed else 0


async def _demo(model: str, via_server: bool, max_tokens: int) -> None:
    """Smoke job: render a tool-calling chat, sample from vLLM, show text and token ids."""
    from transformers import AutoTokenizer

    from agentrl.inference import (
        InferenceClient,
        InferenceConfig,
        SamplingConfig,
        VLLMEngineClient,
        VLLMServer,
        VLLMServerClient,
    )
    from agentrl.models import resolve_model

    started = time.perf_counter()
    path = resolve_model(model)
    print(f"model: {path}  (ready in {time.perf_counter() - started:.1f} s)", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(path)
    config = InferenceConfig()
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tools=[CALCULATOR_SCHEMA], add_generation_prompt=True,
            tokenize=True, return_dict=True,
        )["input_ids"]
        for q in DEMO_QUESTIONS
    ]  # fmt: skip
    sampling = SamplingConfig(max_tokens=max_tokens, temperature=1.0, seed=0)
    print(f"starting vLLM ({'vllm serve over HTTP' if via_server else 'in-process AsyncLLM'})...",
          flush=True)  # fmt: skip

    async def run(client: InferenceClient) -> None:
        t = time.perf_counter()
        results = await asyncio.gather(
            *(client.generate(p, sampling, f"demo-{i}") for i, p in enumerate(prompts))
        )
        elapsed = time.perf_counter() - t
        for question, result in zip(DEMO_QUESTIONS, results, strict=True):
            text = tokenizer.decode(result.token_ids)
            print(f"\nuser: {question}")
            print(f"assistant ({len(result.token_ids)} tokens, {result.finish_reason}, "
                  f"policy v{result.version}): {text!r}")  # fmt: skip
            print(f"token ids: {list(result.token_ids)}")
            mean = sum(result.logprobs) / max(len(result.logprobs), 1)
            print(f"mean behaviour logprob: {mean:.3f}")
        tokens = sum(len(r.token_ids) for r in results)
        print(f"\n{tokens} tokens in {elapsed:.2f} s through vLLM; the tiny model is untrained, "
              f"so its text is noise.")  # fmt: skip

    if via_server:
        async with await VLLMServer.start(path, config, log_dir=".agentrl-logs") as server:
            print(f"vllm serve pid {server.pid} at {server.url}", flush=True)
            async with VLLMServerClient(server.url, config) as client:
                await run(client)
    else:
        async with await VLLMEngineClient.start(path, config) as client:
            await run(client)


if __name__ == "__main__":
    sys.exit(main())
