"""Env servers as Ray actors on a real two-node Ray cluster (loopback), behind EnvServerPool.

Fast (no vLLM; a scripted policy): two ``agentrl serve-env`` actors are placed on the two
worker nodes (one CPU each, so one per node); episodes run through the real
:class:`EnvServerPool`, :class:`EpisodeRunner`, :class:`Scheduler` and store against
their stable local URLs; one actor is killed mid-run (``ray.kill(..., no_restart=False)``):
Ray starts it again, its in-flight episodes fail over to the other server and are retried,
every task's group is complete, no episode is lost or counted twice, and the placement
records the restart. The soak run (a whole ``agentrl train`` with inference servers too)
is tests/cluster/test_cluster_train.py.
"""

from __future__ import annotations

import asyncio
import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from agentrl.cluster.node import ServiceSpec
from agentrl.cluster.runtime import Placement
from agentrl.cluster.services import ActorServer, ClusterServices, ServiceHandle
from agentrl.errors import ServerUnavailable
from agentrl.rollout import tasks_for
from agentrl.runtime.relay import Relay
from tests.cluster.conftest import RayTestCluster
from tests.faults.test_episode_faults import assert_accounted
from tests.remote.test_remote_faults import (
    GROUP_SIZE,
    GUESS,
    PacedClient,
    collect,
    env_config,
    remote_run,
    stored,
)

pytestmark = pytest.mark.timeout(180)


def env_specs(count: int, log_dir: Path) -> list[ServiceSpec]:
    return [
        ServiceSpec("env", n, 60.0, str(log_dir), os.getcwd(), env_id=GUESS) for n in range(count)
    ]


def health(url: str) -> int:
    with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
        return int(r.status)


async def test_env_server_actors_on_two_nodes_serve_episodes_and_survive_a_kill(
    ray_cluster: RayTestCluster, tokenizer: Any, tmp_path: Path, record_fault: Any
) -> None:
    import ray

    tasks = 32
    async with ClusterServices(max_restarts=2) as services:
        handles = await services.start(env_specs(2, tmp_path / "logs"), {}, 90.0)
        placed = services.placement()
        # one per worker node (the head offers no CPU), each bound to its node's address
        assert {ray_cluster.node_name(p["node_id"]) for p in placed} == {"node_a", "node_b"}
        assert all(p["state"] == "alive" and p["node_ip"] == "127.0.0.1" for p in placed)
        assert all(
            p["url"] != p["local_url"] == h.url for p, h in zip(placed, handles, strict=True)
        )
        client = PacedClient(tokenizer, delay_s=0.02)
        urls = [h.url for h in handles]
        env = env_config(urls, id=GUESS)
        async with remote_run(client, env, tmp_path / "run", concurrency=32) as (
            pool,
            scheduler,
            runner,
            queue,
        ):
            running = asyncio.create_task(scheduler.run(tasks_for(GUESS, tasks)), name="run")
            try:
                await asyncio.wait_for(client.after_turns(40).wait(), 60)
                on_killed = pool.members[0].load
                ray.kill(handles[0].actor, no_restart=False)
                await asyncio.wait_for(asyncio.shield(running), 90)
            finally:
                running.cancel()
            run = await collect(scheduler, runner, queue)

            async def restarted() -> None:
                while True:
                    changed = handles[0].changed
                    p = handles[0].placement
                    if p.restarts >= 1 and p.state == "alive":
                        return
                    await changed.wait()

            await asyncio.wait_for(restarted(), 60)
            after = services.placement()
            answered = await asyncio.to_thread(health, handles[0].url)
    ids = [t.episode_id for t in run.final]
    record_fault(
        "ray: 1 of 2 env-server actors killed mid-run",
        injected=1,
        survived=int(all(g.complete for g in run.groups) and len(run.groups) == tasks),
        lost=tasks * GROUP_SIZE - len(set(ids)),
        trained_twice=len(ids) - len(set(ids)),
    )

    assert_accounted(run, tasks)
    assert {(t.status, t.reason) for t in run.final} == {("finished", "found it")}
    failed = run.scheduler.failed_attempts
    assert 1 <= len(failed) <= on_killed, (len(failed), on_killed)  # the kill cost episodes
    assert all(t.failure == "env_unavailable" for t in failed), [t.reason for t in failed]
    # Ray started the killed actor again (a new server process) behind the same URL
    assert after[0]["restarts"] == 1 and after[0]["pid"] != placed[0]["pid"], after
    assert after[0]["local_url"] == placed[0]["local_url"] and answered == 200
    assert after[1]["restarts"] == 0 and after[1]["pid"] == placed[1]["pid"]
    store = stored(tmp_path / "run")
    assert store["integrity"] == "ok"
    assert store["episodes_by_state"].get("finished") == tasks * GROUP_SIZE, store


async def test_an_actor_server_is_dead_to_the_pool_until_restart_sees_rays_new_server() -> None:
    """The ServerPool's view (a unit test over a placement; the real seam: the soak run)."""
    handle = ServiceHandle(actor=None, relay=Relay(), placement=Placement("inference", 0))
    handle._set(state="alive", pid=100)
    server = ActorServer(handle, give_up_at=3)
    assert server.alive and server.restarts == 0
    handle._set(state="alive", pid=200, restarts=1)  # Ray restarted it between two pings
    assert not server.alive  # a new server without the run's weights: the pool catches it up
    await asyncio.wait_for(server.restart(), 5)
    assert server.alive
    handle._set(state="restarting")
    waiting = asyncio.create_task(server.restart(timeout_s=10))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    handle._set(state="alive", pid=300, restarts=2)
    await asyncio.wait_for(waiting, 5)
    assert server.alive and server.restarts == 2
    handle._set(state="dead", reason="restarts used up")
    assert not server.alive and server.restarts == 3  # the pool gives up on it
    with pytest.raises(ServerUnavailable, match="restarts used up"):
        await server.restart()
