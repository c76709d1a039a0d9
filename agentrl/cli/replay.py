"""``agentrl replay``: list, show, export, verify, resume or fork recorded episodes.

The work is :mod:`agentrl.replay`'s; this module reads the flags and prints.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any


def _replay(args: argparse.Namespace, extra: list[str]) -> int:
    from pathlib import Path

    from rich.console import Console

    from agentrl import replay
    from agentrl.errors import ConfigError
    from agentrl.store import EpisodeStore

    # wide enough when piped, so ids and reasons are not folded
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 220)
    with EpisodeStore.open(Path(args.run_dir), create=False) as store:
        if args.episode is not None:
            return _replay_episode(args, store, console)
        filters = dict(
            state=args.state,
            env_id=args.env,
            min_reward=args.min_reward,
            max_reward=args.max_reward,
            min_version_span=args.min_version_span,
            limit=args.limit,
        )
        if args.export:
            n = replay.export(store, Path(args.export), flag="--export", **filters)
            print(f"wrote {n} episodes to {args.export}")
        elif args.verify or args.resume or args.fork_at is not None:
            raise ConfigError("--verify, --resume and --fork-at need an EPISODE id")
        else:
            console.print(replay.list_episodes(store, **filters))
    return 0


def _replay_episode(args: argparse.Namespace, store: Any, console: Any) -> int:
    """``agentrl replay RUN_DIR EPISODE``: show, export, verify, resume or fork it."""
    from pathlib import Path

    from agentrl import replay

    run = replay.recorded_run(store, imports=args.imports)
    recorded = replay.load(store, args.episode, args.attempt)
    if args.export:
        replay.export(store, Path(args.export), only=[recorded], flag="--export")
        print(f"wrote {args.episode} (attempt {recorded.attempt}) to {args.export}")
        return 0
    if args.verify:
        return _replay_verify(args.episode, recorded)
    if not args.resume and args.fork_at is None:
        console.print(replay.transcript(recorded, run.tokenizer(args.model)))
        return 0
    return _replay_continue(args, store, console, run, recorded)


def _replay_verify(episode: str, recorded: Any) -> int:
    from agentrl import replay

    result = replay.verify(recorded)
    calls = sum("tool" in e for e in recorded.env_log[1:])
    if result.difference is None:
        print(
            f"{episode}: reset, {result.steps - calls} steps and {calls} tool calls replayed "
            f"from seed {recorded.task.seed}; every observation, reward, end flag, tool "
            "result and state snapshot matches"
        )
        return 0
    print(f"{episode}: differs at {result.difference}")
    return 1


def _replay_continue(
    args: argparse.Namespace, store: Any, console: Any, run: Any, recorded: Any
) -> int:
    """``--resume`` or ``--fork-at``: run the episode on under the policy that sampled it."""
    from agentrl import replay
    from agentrl.errors import ConfigError

    policy = run.policy(recorded, args.model)
    config = run.with_sampling(temperature=args.temperature, max_tokens=args.max_tokens)
    print(f"policy: {policy.label}", flush=True)
    if args.resume:
        if recorded.partial is None:
            raise ConfigError(
                f"{args.episode} already ended ({recorded.state}); --resume continues "
                f"unfinished episodes; use --fork-at TURN to branch an ended one"
            )
        point, new_id = recorded.partial, replay.new_episode_id(store, f"{args.episode}~resumed")
    else:
        point = replay.fork_point(recorded, args.fork_at)
        new_id = replay.new_episode_id(store, f"{args.episode}~fork@{args.fork_at}")
        print(replay.restore_note(point), flush=True)
    label = replay.label_version(point, policy)
    if label != policy.version:
        print(
            f"its tokens are labelled version {label}, the newest in the episode so far "
            f"(versions never decrease along an episode)",
            flush=True,
        )
    done = asyncio.run(replay.continue_episode(store, point, new_id, policy=policy, config=config))
    tokenizer = run.tokenizer(policy.model if policy.cleanup is None else None)
    if args.resume:
        console.print(replay.transcript(done, tokenizer))
    else:
        title = f"fork at turn {args.fork_at}: temperature {config.rollout.temperature}"
        console.print(replay.side_by_side(recorded, done, args.fork_at, tokenizer, title))
    print(f"stored as {new_id}")
    return 0
