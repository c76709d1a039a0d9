"""``agentrl export``: a run's episodes as an Inspect log, ATIF trajectories or JSONL.

The work is :mod:`agentrl.export`'s; this module reads the flags and prints.
"""

from __future__ import annotations

import argparse
import asyncio


def _export(args: argparse.Namespace, extra: list[str]) -> int:
    from pathlib import Path

    from agentrl.export import export_run
    from agentrl.store import EpisodeStore

    filters = dict(
        state=args.state,
        env_id=args.env,
        min_reward=args.min_reward,
        max_reward=args.max_reward,
        min_version_span=args.min_version_span,
        limit=args.limit,
    )
    with EpisodeStore.open(Path(args.run_dir), create=False) as store:
        result = asyncio.run(export_run(store, args.format, args.out, **filters))
    print(
        f"wrote {result.episodes} episodes to {result.path} ({args.format}, {result.seconds:.1f} s)"
    )
    if args.format == "inspect":
        print(f"view it: inspect view --log-dir {result.path}")
    return 0
