"""The smallest complete async RL run: teach the tiny model to answer in digits.

    python examples/digits/train.py --out runs/digits             # about a minute on CPU
    python examples/digits/train.py --out runs/digits --resume    # after a crash or kill

Everything is real: vLLM generates (in-process), episodes run concurrently, the
trainer steps while generation goes on, each step's weights are published through
the pause/checkpoint/resume protocol, and the run directory holds the episode store
(``episodes.db``) and trainer checkpoints (``checkpoints/``). Kill it at any moment
and ``--resume`` continues: no task is skipped or trained twice, and unfinished
episodes continue from their checkpoints. ``agentrl replay RUN_DIR`` shows any
episode.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Settings:
    model: str = "tiny"
    env_id: str = "agentrl/Digits-v0"
    steps: int = 14
    group_size: int = 8
    groups_per_step: int = 4
    max_tokens: int = 16
    lr: float = 3e-3
    loss: str = "dapo"
    max_staleness: int = 1
    mode: str = "async"
    seed: int = 0


async def train(out: Path, settings: Settings, resume: bool) -> dict[str, float]:
    from agentrl.config import LossConfig, TrainConfig, TrainerConfig
    from agentrl.inference import VLLMEngineClient
    from agentrl.models import resolve_model
    from agentrl.queue import TrajectoryQueue
    from agentrl.rollout import EpisodeRunner, RolloutConfig, Scheduler, tasks_for
    from agentrl.rollout.controller import RolloutController
    from agentrl.store import EpisodeStore, StoreWriter
    from agentrl.trainer.loop import StepRecord, TrainLoop
    from agentrl.trainer.publish import WeightPublisher
    from agentrl.trainer.trainer import Trainer

    path = resolve_model(settings.model)
    trainer = Trainer(
        path,
        TrainerConfig(lr=settings.lr, loss=LossConfig(settings.loss)),  # type: ignore[arg-type]
        temperature=1.0,
        seed=settings.seed,
    )
    batch = settings.group_size * settings.groups_per_step
    store = EpisodeStore.open(out)
    store.begin_run("train", dataclasses.asdict(settings))
    try:
        async with await VLLMEngineClient.start(path, seed=settings.seed) as engine:
            async with StoreWriter(store) as writer:
                rollout = RolloutConfig(max_turns=1, max_tokens_per_turn=settings.max_tokens)
                runner = EpisodeRunner(
                    engine, trainer.tokenizer, rollout, checkpoint=writer.partial
                )
                controller = RolloutController(runner, writer=writer)
                queue = TrajectoryQueue(2 * settings.groups_per_step)
                scheduler = Scheduler(
                    runner,
                    queue,
                    RolloutConfig(
                        concurrency=batch,
                        group_size=settings.group_size,
                        max_staleness=settings.max_staleness,
                    ),
                    batch_size=batch,
                    version=lambda: trainer.version,
                    writer=writer,
                    resume=resume,
                )
                publisher = WeightPublisher(trainer, controller)

                def show(record: StepRecord) -> None:
                    s = record.stats
                    print(
                        f"step {s.step:3d}  reward {s.reward_mean:.3f}  loss {s.loss:+.4f}  "
                        f"clip {s.clip_fraction:.2f}  IS w {s.is_weight_mean:.3f}  "
                        f"staleness max {s.staleness_max:.0f}  tokens {s.tokens}  "
                        f"publish {record.publish.update.pause_to_resume_s * 1000:.0f} ms",
                        flush=True,
                    )

                loop = TrainLoop(
                    trainer,
                    publisher,
                    scheduler,
                    queue,
                    TrainConfig(
                        settings.steps,
                        settings.groups_per_step,
                        mode=settings.mode,
                        checkpoint_every=1,
                    ),  # type: ignore[arg-type]
                    store=store,
                    checkpoint_dir=out / "checkpoints",
                    group_size=settings.group_size,
                    on_step=show,
                )
                if resume:
                    step = await loop.restore()
                    print(
                        f"resumed at step {step} (version {trainer.version}); "
                        f"{len(queue)} complete groups to train first",
                        flush=True,
                    )
                states = store.task_states()
                tasks = (
                    t
                    for t in tasks_for(settings.env_id, None)
                    if states.get(t.task_id, "pending") == "pending"
                )
                try:
                    records = await loop.run(tasks)
                finally:
                    publisher.close()
    finally:
        store.close()
    rewards = [r.stats.reward_mean for r in records]
    return {
        "steps": trainer.step,
        "reward_first": rewards[0] if rewards else float("nan"),
        "reward_last": rewards[-1] if rewards else float("nan"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="run directory")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out")
    parser.add_argument("--steps", type=int, default=Settings.steps)
    parser.add_argument("--mode", choices=("async", "sync"), default=Settings.mode)
    parser.add_argument("--model", default=Settings.model)
    args = parser.parse_args()
    out = Path(args.out)
    settings = Settings(steps=args.steps, mode=args.mode, model=args.model)
    if args.resume:
        from agentrl.store import EpisodeStore

        with EpisodeStore.open(out, create=False) as store:
            recorded = next((r["config"] for r in store.runs() if r["kind"] == "train"), None)
        if recorded is None:
            print(f"error: {out} holds no training run to resume", file=sys.stderr)
            return 1
        settings = Settings(**recorded)
    elif (out / "episodes.db").exists():
        print(f"error: {out} already holds a run; pass --resume or another --out", file=sys.stderr)
        return 1
    started = time.perf_counter()
    result = asyncio.run(train(out, settings, args.resume))
    result["wall_s"] = time.perf_counter() - started
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
