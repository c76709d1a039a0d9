"""Concurrency sweep, and memory: 1 to 4096 concurrent multi-turn episodes.

    python benchmarks/bench_concurrency.py [--levels 1,16,64,256,1024,4096] [--workers 2]
                                           [--worker-levels 1024,4096]

Each level runs ``max(level, 64)`` episodes of ``bench/Echo-v0`` (3 turns of 16
sampled tokens; every env step waits 50 ms without using the CPU, as a tool call to a
service would) with ``level`` of them at once, through the scheduler, runner and
episode store. Reported: sampled tokens/s, episode latency p50/p99, event-loop lag p99
(how late the loop woke up; target under 50 ms at 4096), peak RSS of this process
(the rollout process; vLLM's engine core is its own process), and the bytes per token
in the store and in the trajectory queue. The ``--worker-levels`` run again through
``--workers`` rollout worker processes (:mod:`agentrl.rollout.workers`): the lag is then
the main process's loop (engine calls, scheduler, store), each worker has its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import save, table

STEP_S = 0.05


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def level_run(
    client,
    tokenizer,
    level: int,
    episodes: int,
    turns: int,
    tokens: int,
    store_dir: Path,
    workers: int = 1,
) -> dict:
    import numpy as np

    from agentrl.queue import TrajectoryQueue
    from agentrl.rollout import EpisodeRunner, RolloutConfig, Scheduler, tasks_for
    from agentrl.runtime.metrics import LoopLagMonitor, Metrics
    from agentrl.store import EpisodeStore, StoreWriter

    store_dir.mkdir(parents=True)
    store = EpisodeStore.open(store_dir)
    metrics = Metrics()
    rollout = RolloutConfig(max_turns=turns, max_tokens_per_turn=tokens, ignore_eos=True)
    queue = TrajectoryQueue(episodes + 1)
    async with StoreWriter(store) as writer, contextlib.AsyncExitStack() as stack:
        if workers > 1:
            from agentrl.rollout.workers import WorkerRunner

            runner = await stack.enter_async_context(
                WorkerRunner(
                    client,
                    tokenizer,
                    dataclasses.replace(rollout, workers=workers),
                    metrics=metrics,
                    checkpoint=writer.partial,
                    imports=["benchmarks.common"],
                )
            )
        else:
            runner = EpisodeRunner(
                client, tokenizer, rollout, metrics=metrics, checkpoint=writer.partial
            )
        scheduler = Scheduler(
            runner, queue, RolloutConfig(concurrency=level, group_size=1), writer=writer
        )
        tasks = list(tasks_for("bench/Echo-v0", episodes, turns=turns, step_s=STEP_S))
        async with LoopLagMonitor(metrics):
            t0 = time.perf_counter()
            await scheduler.run(tasks)
            wall = time.perf_counter() - t0
        await writer.flush()
    trajectories = [t for g in queue._groups for t in g.trajectories]
    sampled = sum(int(t.loss_mask.sum()) for t in trajectories)
    latency = np.array([t.timings.total_s for t in trajectories])
    stats = store.stats()
    store.close()
    db_bytes = sum(p.stat().st_size for p in store_dir.iterdir() if p.is_file())
    tokens_total = sum(len(t.token_ids) for t in trajectories)
    # in-memory size of the queued trajectories, per token (arrays + Python objects)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    copies = [_copy(t) for t in trajectories]
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    queue_bytes = sum(s.size_diff for s in after.compare_to(before, "filename"))
    del copies
    return {
        "concurrency": level,
        "workers": workers,
        "episodes": episodes,
        "wall_s": wall,
        "tokens_per_s": sampled / wall,
        "latency_p50_s": float(np.percentile(latency, 50)),
        "latency_p99_s": float(np.percentile(latency, 99)),
        "loop_lag_p99_ms": metrics.percentile("loop_lag_s", 99) * 1000,
        "worker_loop_lag_p99_ms": metrics.percentile("worker_loop_lag_s", 99) * 1000,
        "peak_rss_mib": rss_mib(),
        "store_array_bytes_per_token": stats["array_bytes"] / max(stats["tokens"], 1),
        "store_file_bytes_per_token": db_bytes / max(tokens_total, 1),
        "queue_bytes_per_token": queue_bytes / max(tokens_total, 1),
        "tokens_stored": tokens_total,
    }


def _copy(t):
    import copy

    return copy.deepcopy(t)


async def main_async(args: argparse.Namespace) -> list[dict]:
    from transformers import AutoTokenizer

    from agentrl.inference import InferenceConfig, VLLMEngineClient
    from agentrl.models import resolve_model
    from agentrl.runtime.metrics import tune_gc

    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    config = InferenceConfig(max_model_len=512, max_num_seqs=256, kv_cache_mib=512)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        async with await VLLMEngineClient.start(path, config) as client:
            tune_gc()  # as agentrl train and agentrl rollout do once started
            await level_run(client, tokenizer, 8, 8, 2, 8, Path(tmp) / "warm")
            for level in args.levels:
                episodes = max(level, args.min_episodes)
                row = await level_run(
                    client,
                    tokenizer,
                    level,
                    episodes,
                    args.turns,
                    args.tokens,
                    Path(tmp) / f"c{level}",
                )
                rows.append(row)
                _say(row)
                for n in args.workers if level in args.worker_levels else ():
                    row = await level_run(
                        client,
                        tokenizer,
                        level,
                        episodes,
                        args.turns,
                        args.tokens,
                        Path(tmp) / f"c{level}w{n}",
                        n,
                    )
                    rows.append(row)
                    _say(row)
    return rows


def _say(row: dict) -> None:
    level = row["concurrency"]
    where = f" ({row['workers']} rollout workers)" if row["workers"] > 1 else ""
    print(
        f"  {level:5d} at once{where}: {row['tokens_per_s']:,.0f} tok/s, latency p50 "
        f"{row['latency_p50_s']:.2f} s p99 {row['latency_p99_s']:.2f} s, loop lag "
        f"p99 {row['loop_lag_p99_ms']:.1f} ms, peak RSS "
        f"{row['peak_rss_mib']:.0f} MiB",
        flush=True,
    )


def _report(rows: list[dict]) -> str:
    """The Markdown of the sweep: the table per level, the loop-lag target, memory."""
    md = "### Concurrency sweep (env step waits 50 ms)\n\n" + table(
        [
            "episodes at once",
            "rollout processes",
            "tokens/s",
            "latency p50 (s)",
            "latency p99 (s)",
            "loop lag p99 (ms)",
            "workers' loop lag p99 (ms)",
            "peak RSS (MiB)",
        ],
        [
            [
                r["concurrency"],
                r["workers"],
                r["tokens_per_s"],
                r["latency_p50_s"],
                r["latency_p99_s"],
                r["loop_lag_p99_ms"],
                r["worker_loop_lag_p99_ms"] if r["workers"] > 1 else "",
                r["peak_rss_mib"],
            ]
            for r in rows
        ],
    )
    top = [r for r in rows if r["workers"] == 1][-1]
    md += (
        f"\n\nTarget: loop lag p99 < 50 ms at {top['concurrency']}: one loop "
        f"{'met' if top['loop_lag_p99_ms'] < 50 else 'NOT met'} "
        f"({top['loop_lag_p99_ms']:.1f} ms)"
    )
    for r in rows:
        if r["workers"] > 1 and r["concurrency"] == top["concurrency"]:
            md += (
                f"; {r['workers']} rollout workers "
                f"{'met' if r['loop_lag_p99_ms'] < 50 else 'NOT met'} "
                f"({r['loop_lag_p99_ms']:.1f} ms, the main process's loop; the "
                f"workers' loops {r['worker_loop_lag_p99_ms']:.1f} ms)"
            )
    md += ". With workers, peak RSS is the main process's; each worker has its own."
    md += "\n\n### Memory\n\n" + table(
        ["where", "bytes per token"],
        [
            ["store: token arrays", top["store_array_bytes_per_token"]],
            [
                "store: whole SQLite file (messages, checkpoints, indexes)",
                top["store_file_bytes_per_token"],
            ],
            [
                "queue: a trajectory in memory (arrays + Python objects)",
                top["queue_bytes_per_token"],
            ],
        ],
    )
    md += (
        f"\n\nPeak RSS of the rollout process with {top['concurrency']} episodes at once: "
        f"{top['peak_rss_mib']:.0f} MiB."
    )
    return md


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--levels", default="1,16,64,256,1024,4096")
    parser.add_argument("--min-episodes", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument(
        "--workers",
        default="2",
        help="also run the --worker-levels through this many rollout worker "
        "processes (comma-separated; '' for none)",
    )
    parser.add_argument("--worker-levels", default="1024,4096")
    args = parser.parse_args(argv)
    args.levels = [int(x) for x in str(args.levels).split(",")]
    args.workers = [int(x) for x in str(args.workers).split(",") if x.strip()]
    args.worker_levels = [int(x) for x in str(args.worker_levels).split(",") if x.strip()]
    print(
        f"concurrency sweep: levels {args.levels}, {args.turns} turns x {args.tokens} tokens, "
        f"env step {STEP_S * 1000:.0f} ms",
        flush=True,
    )
    rows = asyncio.run(main_async(args))
    md = _report(rows)
    print(md, flush=True)
    result = {"levels": rows}
    save("concurrency", vars(args), result, md)
    return result


if __name__ == "__main__":
    main()
