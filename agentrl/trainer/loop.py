"""The training loop: consume complete groups, step, record, publish, checkpoint.

Two modes run the same code on the same work, so benchmarks can compare them:

* ``async``: generation runs all the time (the scheduler in the same
  ``asyncio.TaskGroup``); the trainer takes ``groups_per_step`` groups from the
  queue as they complete, while newer episodes keep generating under the old
  weights; staleness is bounded by the scheduler's admission control.
* ``sync``: generate exactly ``groups_per_step`` groups, then train, then publish,
  then the next batch: no overlap, every token on-policy.

Order per step, chosen so that a kill at any moment trains nothing twice and loses
nothing: optimizer step, then the store records the groups as consumed at that step,
then the weights are published, then (every ``checkpoint_every`` steps) a trainer
checkpoint. On ``--resume``, consumption recorded after the last checkpoint is rolled
back (those groups are trained again, once, by the restored trainer), complete
groups not yet consumed are trained first, and unfinished episodes continue.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from agentrl.config import TrainConfig
from agentrl.errors import StopRequested
from agentrl.protocols import RolloutSource
from agentrl.queue import TrajectoryQueue
from agentrl.runtime.tracing import CHECKPOINT_LANE, SYNC_LANE, TRAIN_LANE, TRAINER, Tracer
from agentrl.store import EpisodeStore
from agentrl.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from agentrl.trainer.publish import PublishStats, WeightPublisher
from agentrl.trainer.trainer import StepStats, Trainer
from agentrl.types import Group, Task

logger = logging.getLogger(__name__)


@dataclasses.dataclass(slots=True)
class StepRecord:
    stats: StepStats
    publish: PublishStats | None
    train_s: float
    groups: list[Group] = dataclasses.field(default_factory=list)
    """The groups trained at this step."""


class TrainLoop:
    """Wires a trainer, a publisher, a scheduler and a queue (and optionally a store).

    ``group_size``: episodes per group (``rollout.group_size``), so that a step trains
    ``config.groups_per_step * group_size`` trajectories; :meth:`restore` tells the
    scheduler how many episodes the restored trainer has consumed. None: it does not
    (admission then counts from zero).
    """

    def __init__(
        self,
        trainer: Trainer,
        publisher: WeightPublisher,
        scheduler: RolloutSource,
        queue: TrajectoryQueue,
        config: TrainConfig,
        *,
        store: EpisodeStore | None = None,
        checkpoint_dir: Path | None = None,
        on_step: Callable[[StepRecord], Any] | None = None,
        tracer: Tracer | None = None,
        group_size: int | None = None,
        sleeper: Any = None,
    ) -> None:
        self.trainer = trainer
        self.sleeper = sleeper
        """With ``inference.sleep_during_train`` (sync mode, one GPU): the engine, put
        to sleep for each train step (``await sleeper.sleep()``) and woken to publish
        (``await sleeper.wake_up()``)."""
        self.publisher = publisher
        self.scheduler = scheduler
        self.queue = queue
        self.config = config
        self.store = store
        self.checkpoint_dir = checkpoint_dir
        self.on_step = on_step
        self.tracer = tracer or Tracer(None)
        self.group_size = group_size
        self.records: list[StepRecord] = []
        self.busy = {"train_s": 0.0, "publish_s": 0.0}
        self._consumed: int | None = None  # the last step whose groups the store marked
        self._checkpointed: int | None = None
        if trainer.config.borrow_idle_cores:  # on CPU: vLLM's core, while generation waits
            trainer.lend_cores = scheduler.generation_idle
        # one thread for all trainer math, pinned off vLLM's core once
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="trainer", initializer=trainer.pin
        )

    async def restore(self) -> int:
        """Bring back the last checkpoint and agree with the store; return the step.

        Loads the latest trainer checkpoint (if any) and loads its weights into the
        engine as its version; rolls back consumption recorded after it; queues the
        complete groups not yet trained (in task order) ahead of new ones; tells the
        scheduler how many episodes were admitted before (one batch per version), so
        admission goes on from there.
        """
        step = 0
        folder = latest_checkpoint(self.checkpoint_dir) if self.checkpoint_dir else None
        if folder is not None:
            await asyncio.to_thread(load_checkpoint, self.trainer, folder)
            step = self.trainer.step
            if self.trainer.version > 0:  # the engine serves the restored weights
                await self.publisher.publish(version=self.trainer.version)
        if self.store is not None:
            await asyncio.to_thread(self.store.rollback_consumed, step)
            # All of them, even more than the queue's bound: nothing is running yet to
            # drain it, so waiting for room here would never end.
            await self.queue.put_restored(await asyncio.to_thread(self.store.untrained_groups))
        if self.group_size is not None:
            batch = self.config.groups_per_step * self.group_size
            self.scheduler.resume_admitted(self.trainer.version * batch)
        return step

    async def run(self, tasks: Iterable[Task]) -> list[StepRecord]:
        remaining = self.config.steps - self.trainer.step
        try:
            if remaining <= 0:
                return self.records
            if self.config.mode == "sync":
                await self._run_sync(tasks, remaining)
            else:
                await self._run_async(tasks, remaining)
            return self.records
        except asyncio.CancelledError:  # stopped (Ctrl-C, SIGTERM): keep a due checkpoint
            await self._checkpoint_on_stop()
            raise
        finally:
            if self.trainer.world > 1:  # release the followers
                from agentrl.trainer.distributed import broadcast_groups

                await asyncio.get_running_loop().run_in_executor(
                    self._executor, broadcast_groups, None, self.trainer.accelerator
                )
            self._executor.shutdown(wait=True)

    def _checkpoint_due(self) -> bool:
        """The trainer's step is a ``checkpoint_every`` step not yet saved."""
        every, step = self.config.checkpoint_every, self.trainer.step
        return bool(
            self.checkpoint_dir is not None
            and every
            and step % every == 0
            and step > 0
            and self._checkpointed != step
        )

    def _save_now(self) -> None:
        assert self.checkpoint_dir is not None
        save_checkpoint(self.trainer, self.checkpoint_dir)
        self._checkpointed = self.trainer.step

    async def _save_checkpoint(self) -> None:
        # On the trainer's thread: a stop waits for a save in flight, never races it.
        with self.tracer.section("checkpoint", TRAINER, CHECKPOINT_LANE):
            await asyncio.get_running_loop().run_in_executor(self._executor, self._save_now)

    async def _checkpoint_on_stop(self) -> None:
        """A stop that landed between a checkpoint step's optimizer step and its save
        (publishing, say) still writes that checkpoint, once the step's thread is done
        and only if the store has marked the step's groups (else the checkpoint would
        hold groups that ``--resume`` trains again). A second signal or the grace period
        ends it at once; the previous checkpoint stays intact (writes are atomic)."""
        if self.trainer.world > 1 or self.checkpoint_dir is None:
            return
        await asyncio.to_thread(self._executor.shutdown, True)  # the step in flight ends
        if self._consumed == self.trainer.step and self._checkpoint_due():
            await asyncio.to_thread(self._save_now)
            logger.info("stopped: wrote the due checkpoint of step %d", self.trainer.step)

    async def _run_async(self, tasks: Iterable[Task], steps: int) -> None:
        async with asyncio.TaskGroup() as tg:
            generation = tg.create_task(self.scheduler.run(tasks), name="generation")
            try:
                for _ in range(steps):
                    groups = await self._take()
                    await self._train(groups)
            finally:
                self.scheduler.stop()
                generation.cancel()  # unfinished episodes keep their checkpoints

    async def _run_sync(self, tasks: Iterable[Task], steps: int) -> None:
        source = iter(tasks)
        k = self.config.groups_per_step
        for _ in range(steps):
            needed = k - len(self.queue)
            if needed > 0:
                await self.scheduler.run(list(itertools.islice(source, needed)))
            await self._train(await self._take())

    async def _take(self) -> list[Group]:
        """The step's groups. Async with a staleness bound ``k``: every group admitted
        at version ``trainer.version - k`` or before is in it (waited for if it is still
        running), so none is trained more than ``k`` versions after its admission."""
        k = self.scheduler.staleness.max_staleness
        due = self.trainer.version - k if self.config.mode == "async" and k is not None else None
        return await self.queue.get_batch(self.config.groups_per_step, due=due)

    async def _train(self, groups: list[Group]) -> None:
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        if self.trainer.world > 1:  # the other ranks (running follow()) train on them too
            from agentrl.trainer.distributed import broadcast_groups

            await loop.run_in_executor(
                self._executor, broadcast_groups, groups, self.trainer.accelerator
            )
        if self.sleeper is not None:
            await self.sleeper.sleep()
        try:
            stats = await loop.run_in_executor(self._executor, self.trainer.train_step, groups)
        finally:
            if self.sleeper is not None:
                await self.sleeper.wake_up()
        train_s = time.perf_counter() - t0
        self.busy["train_s"] += train_s
        self.tracer.span(
            f"train step {stats.step}",
            TRAINER,
            TRAIN_LANE,
            t0,
            t0 + train_s,
            {"tokens": stats.tokens, "loss": stats.loss},
            cat="train",
        )
        if self.store is not None:
            await asyncio.to_thread(self.store.mark_consumed, groups, self.trainer.step)
        self._consumed = self.trainer.step
        t1 = time.perf_counter()
        published = await self.publisher.publish()
        t2 = time.perf_counter()
        self.busy["publish_s"] += t2 - t1
        self.tracer.span(
            f"weight sync v{published.version}",
            TRAINER,
            SYNC_LANE,
            t1,
            t2,
            published.update.as_dict(),
            cat="sync",
        )
        await self.scheduler.notify_version()
        if self._checkpoint_due():
            await self._save_checkpoint()
        record = StepRecord(stats, published, train_s, groups)
        self.records.append(record)
        if self.on_step is not None:
            try:
                self.on_step(record)
            except StopRequested:  # asked to stop after this step: --resume starts after it
                if self.checkpoint_dir is not None and self.trainer.world == 1:
                    if self._checkpointed != self.trainer.step:
                        await self._save_checkpoint()
                raise
