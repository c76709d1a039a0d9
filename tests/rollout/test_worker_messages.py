"""A dead rollout worker started again in the middle of a run (``WorkerRunner(restarts=)``):
its episodes continue on the new worker from their newest checkpoints, the scheduler
never sees the death, and every episode ends once (real worker processes, SIGKILL)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from agentrl.queue import TrajectoryQueue
from agentrl.rollout import RolloutConfig, Scheduler, tasks_for
from agentrl.rollout.workers import WorkerRunner
from agentrl.runtime.metrics import Metrics
from agentrl.store import EpisodeStore, StoreWriter
from agentrl.types import Trajectory
from tests.rollout.test_workers import IMPORTS, SlowClient, _key, _run, tokenizer  # noqa: F401

pytestmark = pytest.mark.timeout(180)

EPISODES, TURNS = 32, 4


async def _run_with_a_kill(
    tokenizer: Any,  # noqa: F811
    tmp: Path,
    restarts: int,
) -> tuple[list[Trajectory], EpisodeStore, WorkerRunner, int]:
    """The episodes on two workers, worker 0 SIGKILLed mid-run; (trajectories, store,
    runner, episodes the dead worker held)."""
    client = SlowClient(tokenizer, delay_s=0.02)
    rollout = RolloutConfig(
        max_turns=TURNS,
        max_tokens_per_turn=8,
        ignore_eos=True,
        workers=2,
        group_size=1,
        concurrency=16,
    )
    store = EpisodeStore.open(tmp)
    queue = TrajectoryQueue(EPISODES + 1)
    async with StoreWriter(store) as writer:
        runner = WorkerRunner(
            client,
            tokenizer,
            rollout,
            imports=IMPORTS,
            metrics=Metrics(),
            checkpoint=writer.partial,
            restarts=restarts,
        )
        async with runner:
            scheduler = Scheduler(runner, queue, rollout, writer=writer)
            async with asyncio.TaskGroup() as tg:
                run = tg.create_task(
                    scheduler.run(list(tasks_for("bench/Echo-v0", EPISODES, turns=TURNS)))
                )
                await client.wait_calls(40)
                victim = next(w for w in runner._workers if w.index == 0)
                held = len(victim.running)
                os.kill(victim.process.pid, signal.SIGKILL)
                await run
            assert victim.process.pid not in runner.pids and len(runner.pids) == 2
        await writer.flush()
    return [t for g in queue._groups for t in g.trajectories], store, runner, held


async def test_a_dead_worker_is_started_again_and_its_episodes_continue(
    tokenizer: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    killed, store, runner, held = await _run_with_a_kill(tokenizer, tmp_path / "killed", 1)
    assert held > 0  # the worker died holding episodes
    assert runner.worker_restarts == 1 and runner.restarts_left == 0
    assert runner.metrics.counters["rollout_worker_restarts"] == 1
    assert len(killed) == EPISODES and {t.status for t in killed} == {"finished"}
    assert len({t.episode_id for t in killed}) == EPISODES
    # some continued from a checkpoint (not from the start): the runner marks the resume
    assert any(t.info.get("resumed") for t in killed), [t.info for t in killed][:3]
    report = store.audit()
    assert report["ok"], report
    store.close()
    # token for token what a run without the kill gives (the prefix kept, nothing redone)
    clean, store2, _ = await _run(
        tokenizer, SlowClient(tokenizer), tmp_path / "clean", 2, EPISODES, TURNS
    )
    store2.close()
    assert _key(killed) == _key(clean)
