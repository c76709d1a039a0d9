"""A stop asked for after a step (a health rule in ``health.stop_on``): the training loop
writes that step's checkpoint before it ends, so ``--resume`` starts right after it.
Real trainer (the tiny model on CPU), real queue; the rollout side is a stand-in that
hands over ready groups."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agentrl.config import TrainConfig, TrainerConfig
from agentrl.health import HealthStop
from agentrl.protocols import UpdateStats
from agentrl.queue import TrajectoryQueue
from agentrl.trainer.checkpoint import latest_checkpoint
from agentrl.trainer.loop import StepRecord, TrainLoop
from agentrl.trainer.publish import PublishStats
from agentrl.trainer.trainer import Trainer
from tests.trainer.test_checkpoint import synthetic_groups

pytestmark = pytest.mark.timeout(240)


class Staleness:
    max_staleness = 0


class ReadyGroups:
    """The scheduler's part in sync mode: each run() puts the next ready groups."""

    staleness = Staleness()

    def __init__(self, queue: TrajectoryQueue) -> None:
        self.queue, self.seed = queue, 0

    async def run(self, tasks: Any) -> None:
        for _ in tasks:
            self.seed += 1
            await self.queue.put(synthetic_groups(self.seed, groups=1)[0])

    async def notify_version(self) -> None:
        pass

    def resume_admitted(self, n: int) -> None:
        pass

    def stop(self) -> None:
        pass

    def generation_idle(self) -> bool:
        return True


class Publisher:
    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    async def publish(self, version: int | None = None) -> PublishStats:
        update = UpdateStats(self.trainer.version, "resume", "test", 0, 0, 0, 0, 0, 0, 0, 0)
        return PublishStats(self.trainer.version, "full", 0, 0.0, update)


def loop_for(tiny_model: Path, checkpoints: Path, on_step: Any = None) -> TrainLoop:
    trainer = Trainer(str(tiny_model), TrainerConfig(), temperature=1.0, seed=0)
    queue = TrajectoryQueue(4)
    config = TrainConfig(steps=4, groups_per_step=1, mode="sync", checkpoint_every=5)
    return TrainLoop(
        trainer,
        Publisher(trainer),
        ReadyGroups(queue),
        queue,
        config,  # type: ignore[arg-type]
        checkpoint_dir=checkpoints,
        on_step=on_step,
        group_size=3,
    )


def test_a_stop_after_a_step_checkpoints_it_and_resume_starts_after_it(
    tiny_model: Path, tmp_path: Path
) -> None:
    def on_step(record: StepRecord) -> None:
        if record.stats.step == 2:
            raise HealthStop("health.stop_on: entropy_collapse at step 2")

    loop = loop_for(tiny_model, tmp_path, on_step)
    with pytest.raises(HealthStop, match="entropy_collapse"):
        asyncio.run(loop.run(iter(range(100))))
    assert loop.trainer.step == 2
    folder = latest_checkpoint(tmp_path)
    assert folder is not None  # checkpoint_every = 5: only the stop wrote one
    again = loop_for(tiny_model, tmp_path)
    assert asyncio.run(again.restore()) == 2
    records = asyncio.run(again.run(iter(range(100))))
    assert [r.stats.step for r in records] == [3, 4]
