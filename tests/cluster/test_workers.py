"""Rollout workers as Ray actors on a real two-node Ray cluster: the same episodes as
local worker processes, and a worker actor killed mid-run loses nothing.

Real actors, a real TCP channel, real SQLite, the real scheduler; the engine is the
scripted client of tests/rollout/test_workers.py in this process (the worker <-> main
seam is the one under test; the soak test runs `agentrl train` against real vLLM).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.cluster.workers import ActorProcess, actor_spawner, open_cluster_runner
from agentrl.config import ClusterConfig, ModelConfig, RunConfig
from agentrl.errors import InfraError
from agentrl.queue import TrajectoryQueue
from agentrl.rollout import RolloutConfig, Scheduler, tasks_for
from agentrl.rollout.workers import WorkerRunner, open_runner
from agentrl.runtime.metrics import Metrics
from agentrl.status import RunStatus
from agentrl.store import EpisodeStore, StoreWriter
from agentrl.types import Trajectory
from tests.cluster.conftest import node_of
from tests.rollout.test_workers import IMPORTS, SlowClient, _key, _leaves


@pytest.fixture(scope="module")
def ray_connected(head_and_node2: Any) -> Iterator[Any]:
    import ray

    ray.init(address=head_and_node2.address)
    try:
        yield head_and_node2
    finally:
        ray.shutdown()


async def _run(
    tokenizer: Any,
    client: Any,
    tmp: Path,
    episodes: int,
    turns: int,
    *,
    spawn: Any = None,
    during: Any = None,
    resume: bool = False,
    status: RunStatus | None = None,
) -> tuple[list[Trajectory], EpisodeStore, Any]:
    """``status``: the workers are opened as a run opens them on a cluster
    (``open_cluster_runner``, one CPU each), their rows going to this status."""
    import asyncio

    rollout = RolloutConfig(
        max_turns=turns,
        max_tokens_per_turn=8,
        ignore_eos=True,
        workers=2,
        group_size=1,
        concurrency=16,
    )
    store = EpisodeStore.open(tmp)
    queue = TrajectoryQueue(episodes + 1)
    extra: dict[str, Any] = {} if spawn is None else {"spawn": spawn}
    opener: Any = open_runner
    if status is not None:
        opener = open_cluster_runner
        extra = {"cluster": ClusterConfig(backend="ray", worker_resources={"CPU": 1})}
        extra["status"] = status
    async with StoreWriter(store) as writer, contextlib.AsyncExitStack() as stack:
        runner = await opener(
            stack,
            client,
            tokenizer,
            rollout,
            model=ModelConfig(),
            imports=IMPORTS,
            metrics=Metrics(),
            checkpoint=writer.partial,
            **extra,
        )
        scheduler = Scheduler(runner, queue, rollout, writer=writer, resume=resume)
        tasks = list(tasks_for("bench/Echo-v0", episodes, turns=turns))
        async with asyncio.TaskGroup() as tg:
            run = tg.create_task(scheduler.run(tasks))
            if during is not None:
                await during(runner)
            await run
        await writer.flush()
    return [t for g in queue._groups for t in g.trajectories], store, runner


@pytest.mark.timeout(180)
async def test_worker_actors_on_two_nodes_give_the_episodes_local_workers_give(
    ray_connected: Any, tokenizer: Any, tmp_path: Path
) -> None:
    status = RunStatus(RunConfig(), tmp_path, Metrics())
    nodes: list[str] = []

    async def placed(runner: WorkerRunner) -> None:
        processes = [w.process for w in runner._workers]
        assert all(isinstance(p, ActorProcess) for p in processes)
        nodes.extend(p.node for p in processes)  # type: ignore[union-attr]
        # status.json's rows: each worker on the node its process really runs on (its
        # raylet's), as the spawner placed it
        rows = status.snapshot()["placement"]
        assert [(r["piece"], r["index"], r["state"]) for r in rows] == [
            ("worker", 0, "alive"),
            ("worker", 1, "alive"),
        ]
        assert sorted(r["pid"] for r in rows) == sorted(p.pid for p in processes)
        assert [r["node_id"] for r in rows] == [node_of(ray_connected, r["pid"]) for r in rows]
        assert all(r["node_ip"] == "127.0.0.1" for r in rows)

    local, store1, _ = await _run(tokenizer, SlowClient(tokenizer), tmp_path / "local", 16, 3)
    actors, store2, _ = await _run(
        tokenizer, SlowClient(tokenizer), tmp_path / "ray", 16, 3, during=placed, status=status
    )
    # one CPU per node, one per worker: the two workers run on the two nodes
    assert len(set(nodes)) == 2
    rows = status.placement()  # the run closed its workers: each stopped
    assert [(r["state"], r["reason"]) for r in rows] == [("dead", "stopped")] * 2
    assert len(actors) == 16 and _key(actors) == _key(local)  # token for token
    for store in (store1, store2):
        assert store.audit()["ok"]
        store.close()


@pytest.mark.timeout(240)
async def test_a_killed_worker_actor_stops_the_run_and_resume_finishes_it(
    ray_connected: Any, tokenizer: Any, tmp_path: Path
) -> None:
    actors_placed: list[ActorProcess] = []
    spawn = actor_spawner(ClusterConfig(backend="ray"), actors_placed)
    client = SlowClient(tokenizer, delay_s=0.02)
    killed: list[int] = []

    async def kill(runner: WorkerRunner) -> None:
        await client.wait_calls(40)
        killed.append(runner._workers[0].index)
        os.kill(runner._workers[0].process.pid, signal.SIGKILL)  # the actor's process

    with pytest.raises(BaseExceptionGroup) as caught:
        await _run(tokenizer, client, tmp_path, 32, 4, spawn=spawn, during=kill)
    errors = [e for e in _leaves(caught.value) if isinstance(e, InfraError)]
    assert errors and f"rollout worker {killed[0]} " in str(errors[0]), errors
    assert "died" in str(errors[0])
    assert "--resume" in str(errors[0])
    states = {p.index: p.row() for p in actors_placed}
    assert states[killed[0]]["state"] == "dead", states  # and why: not a clean stop
    assert "died" in states[killed[0]]["reason"].lower(), states
    store = EpisodeStore.open(tmp_path)
    paused = [r["episode_id"] for r in store.episodes() if r["state"] == "paused"]
    assert paused and all(store.partial(e) is not None for e in paused)  # checkpointed
    store.close()
    # --resume on new worker actors: the checkpointed episodes continue, all 32 end once
    _, store, runner = await _run(
        tokenizer, SlowClient(tokenizer), tmp_path, 32, 4, spawn=spawn, resume=True
    )
    assert runner.metrics.counters["episodes_resumed"] == len(paused)
    assert len({t.episode_id for t in store.all_trajectories()}) == 32
    report = store.audit()
    assert report["ok"] and not report["lost"] and not report["trained_twice"], report
    store.close()
