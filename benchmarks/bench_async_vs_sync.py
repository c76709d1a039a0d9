"""Async against sync training: the same env, model, trajectories and steps.

    python benchmarks/bench_async_vs_sync.py [--steps 10] [--groups 4] [--tokens 48]

Both runs are ``agentrl train`` (real vLLM in-process, the trainer in its own thread
pinned off vLLM's core) on ``agentrl/Digits-v0`` with the tiny model, differing only
in ``train.mode``. Reported for each: the training loop's wall time, the time
generation was running (any episode waiting on the engine) and the time the trainer
was busy (steps and weight publishing). Overlap efficiency is the async wall time
over max(generation busy, training busy) measured in the async run: 1.0 is the
physical limit of overlap (target: at most 1.15). The speed-up is sync wall over async
wall (target: at least 1.6 when generation and training take similar time; the table
shows how similar they were).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import save, table


def run_mode(mode: str, args: argparse.Namespace, out: Path) -> dict:
    from agentrl.config import RunConfig
    from agentrl.run import train

    config = RunConfig.from_dict(
        {
            "run": {"out": str(out), "name": f"bench-{mode}", "seed": 0},
            "model": {"path": args.model},
            "env": {"id": "agentrl/Digits-v0"},
            "rollout": {
                "group_size": args.group_size,
                "concurrency": args.group_size * args.groups,
                "max_turns": 1,
                "max_tokens_per_turn": args.tokens,
                "max_staleness": 1,
            },
            "trainer": {"lr": 1e-3, "micro_batch_tokens": 1024},
            "train": {
                "steps": args.steps,
                "groups_per_step": args.groups,
                "mode": mode,
                "checkpoint_every": 0,
            },
            "log": {"progress": "none", "tensorboard": False, "trace": False, "plots": False},
        }
    )
    config.check()
    result = asyncio.run(train(config, out))
    busy = result.busy
    training = busy.get("train_s", 0.0) + busy.get("publish_s", 0.0)
    return {
        "mode": mode,
        "loop_s": result.loop_s,
        "generation_busy_s": busy["generation_s"],
        "training_busy_s": training,
        "steps": result.steps,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args(argv)
    print(
        f"async vs sync: {args.steps} steps x {args.groups} groups x {args.group_size} "
        f"episodes, {args.tokens} tokens per episode",
        flush=True,
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("sync", "async"):
            row = run_mode(mode, args, Path(tmp) / mode)
            rows.append(row)
            print(
                f"  {mode}: loop {row['loop_s']:.1f} s, generation busy "
                f"{row['generation_busy_s']:.1f} s, training busy "
                f"{row['training_busy_s']:.1f} s",
                flush=True,
            )
    sync, async_ = rows
    bound = max(async_["generation_busy_s"], async_["training_busy_s"])
    efficiency = async_["loop_s"] / bound if bound else float("nan")
    speedup = sync["loop_s"] / async_["loop_s"]
    balance = sync["generation_busy_s"] / max(sync["training_busy_s"], 1e-9)
    md = "### Async against sync (same env, model, trajectories, steps)\n\n" + table(
        ["mode", "wall (s)", "generation busy (s)", "training busy (s)"],
        [[r["mode"], r["loop_s"], r["generation_busy_s"], r["training_busy_s"]] for r in rows],
    )
    md += (
        f"\n\nSpeed-up of async over sync: **{speedup:.2f}x** (target >= 1.6). Overlap "
        f"efficiency (async wall / max(generation, training busy)): **{efficiency:.2f}** "
        f"(target <= 1.15). Generation/training time in sync: {balance:.2f}."
    )
    print(md, flush=True)
    result = {
        "runs": rows,
        "speedup": speedup,
        "overlap_efficiency": efficiency,
        "generation_over_training_sync": balance,
    }
    save("async_vs_sync", vars(args), result, md)
    return result


if __name__ == "__main__":
    main()
