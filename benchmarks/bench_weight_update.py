"""What a weight update costs with 1, 64 and 256 episodes in flight (``resume`` policy).

    python benchmarks/bench_weight_update.py [--levels 1,64,256] [--updates 6]

Episodes of ``bench/Echo-v0`` (6 turns of 32 tokens) run through the scheduler with
``level`` at once while the controller publishes full weights (the tiny model's own,
from /dev/shm) every 0.5 s: gate closed, requests aborted with their tokens kept, every
paused episode checkpointed durably, weights reloaded, gate reopened. Reported per
level: pause-to-resume time (p50, max), episodes paused, tokens re-prefilled, tokens
discarded (0 is the promise of ``resume``), and store write time per paused episode
(p50, p99 over the updates).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import save, table


async def level_run(
    client, tokenizer, weights: Path, level: int, updates: int, store_dir: Path
) -> dict:
    import numpy as np

    from agentrl.queue import TrajectoryQueue
    from agentrl.rollout import EpisodeRunner, RolloutConfig, Scheduler, tasks_for
    from agentrl.rollout.controller import RolloutController
    from agentrl.store import EpisodeStore, StoreWriter

    store_dir.mkdir(parents=True)
    store = EpisodeStore.open(store_dir)
    rollout = RolloutConfig(max_turns=6, max_tokens_per_turn=32, ignore_eos=True)
    episodes = level * 4
    queue = TrajectoryQueue(episodes + 1)
    stats = []
    async with StoreWriter(store) as writer:
        runner = EpisodeRunner(client, tokenizer, rollout, checkpoint=writer.partial)
        controller = RolloutController(runner, writer=writer)
        scheduler = Scheduler(
            runner, queue, RolloutConfig(concurrency=level, group_size=1), writer=writer
        )
        tasks = list(tasks_for("bench/Echo-v0", episodes, turns=6))
        generation = asyncio.create_task(scheduler.run(tasks))
        await asyncio.sleep(1.0)
        for _ in range(updates):
            if generation.done():
                break
            stats.append(await controller.update_weights(str(weights)))
            await asyncio.sleep(0.5)
        await generation
    sampled = sum(int(t.loss_mask.sum()) for g in queue._groups for t in g.trajectories)
    store.close()
    per_episode = [s.store_write_s / s.episodes_paused for s in stats if s.episodes_paused]
    pause = [s.pause_to_resume_s for s in stats]
    return {
        "in_flight": level,
        "updates": len(stats),
        "pause_to_resume_p50_ms": float(np.percentile(pause, 50)) * 1000 if pause else None,
        "pause_to_resume_max_ms": max(pause) * 1000 if pause else None,
        "episodes_paused_mean": float(np.mean([s.episodes_paused for s in stats])),
        "tokens_reprefilled_mean": float(np.mean([s.tokens_reprefilled for s in stats])),
        "tokens_discarded": int(sum(s.tokens_discarded for s in stats)),
        "store_write_per_episode_p50_ms": float(np.percentile(per_episode, 50)) * 1000
        if per_episode
        else None,
        "store_write_per_episode_p99_ms": float(np.percentile(per_episode, 99)) * 1000
        if per_episode
        else None,
        "episodes": episodes,
        "tokens_sampled": sampled,
        "all_tokens_kept": sampled == episodes * 6 * 32,
    }


async def main_async(args: argparse.Namespace) -> list[dict]:
    from transformers import AutoTokenizer

    from agentrl.inference import InferenceConfig, VLLMEngineClient
    from agentrl.models import resolve_model
    from agentrl.runtime.metrics import tune_gc

    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    weights = Path(tempfile.mkdtemp(prefix="agentrl-bench-weights-", dir="/dev/shm"))
    shutil.copy(Path(path) / "model.safetensors", weights / "model.safetensors")
    config = InferenceConfig(max_model_len=512, max_num_seqs=256)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            async with await VLLMEngineClient.start(path, config) as client:
                tune_gc()
                for level in args.levels:
                    row = await level_run(
                        client, tokenizer, weights, level, args.updates, Path(tmp) / f"l{level}"
                    )
                    rows.append(row)
                    print(
                        f"  {level:4d} in flight: pause-to-resume p50 "
                        f"{row['pause_to_resume_p50_ms']:.0f} ms, paused "
                        f"{row['episodes_paused_mean']:.0f}, re-prefilled "
                        f"{row['tokens_reprefilled_mean']:.0f} tokens, discarded "
                        f"{row['tokens_discarded']}",
                        flush=True,
                    )
    finally:
        shutil.rmtree(weights, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--levels", default="1,64,256")
    parser.add_argument("--updates", type=int, default=6)
    args = parser.parse_args(argv)
    args.levels = [int(x) for x in str(args.levels).split(",")]
    print(f"weight-update cost: levels {args.levels}, {args.updates} updates each", flush=True)
    rows = asyncio.run(main_async(args))
    md = "### Weight update cost (resume policy, full weights of the tiny model)\n\n" + table(
        [
            "in flight",
            "updates",
            "pause-to-resume p50 (ms)",
            "max (ms)",
            "episodes paused",
            "tokens re-prefilled",
            "tokens discarded",
            "store write / paused episode p50 (ms)",
            "p99 (ms)",
        ],
        [
            [
                r["in_flight"],
                r["updates"],
                r["pause_to_resume_p50_ms"],
                r["pause_to_resume_max_ms"],
                r["episodes_paused_mean"],
                r["tokens_reprefilled_mean"],
                r["tokens_discarded"],
                r["store_write_per_episode_p50_ms"],
                r["store_write_per_episode_p99_ms"],
            ]
            for r in rows
        ],
    )
    kept = all(r["all_tokens_kept"] and r["tokens_discarded"] == 0 for r in rows)
    md += (
        f"\n\nEvery sampled token kept (sampled = episodes x 6 turns x 32 tokens, "
        f"0 discarded): {'yes' if kept else 'NO'}."
    )
    print(md, flush=True)
    result = {"levels": rows}
    save("weight_update", vars(args), result, md)
    return result


if __name__ == "__main__":
    main()
