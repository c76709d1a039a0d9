"""A whole `agentrl train` on a two-node Ray cluster (loopback), with faults (soak).

The test builds Ray's test cluster (a head with no CPUs, two worker nodes each offering
{"node_a": 1} or {"node_b": 1}); `agentrl train` joins it (``cluster.address``) and
starts two inference servers (real ``vllm serve`` on the tiny model) and two env servers
(``agentrl serve-env``) as Ray actors, spread one of each per node. Mid-run, one
inference-server actor is killed (its process, by PID), then a whole node is removed
(``cluster.remove_node``). Ray restarts the pieces on the node that is left; the run
finishes, ``agentrl audit`` is clean, every task is trained exactly once, and status.json
shows the placement.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import RayTestCluster, start_cluster, stop_cluster
from tests.faults.harness import AGENTRL, Proc, agentrl_env, audit, consumed_steps, wait_until

pytestmark = [pytest.mark.soak, pytest.mark.vllm, pytest.mark.timeout(1500)]

STEPS = 8
GROUPS_PER_STEP = 2

CONFIG = """
[run]
name = "ray-cluster"
[env]
id = "agentrl/GuessNumber-v0"
reconnect_timeout_s = 300.0
[rollout]
group_size = 4
concurrency = 16
max_turns = 3
max_tokens_per_turn = 8
[inference]
reconnect_timeout_s = 400.0
[train]
steps = {steps}
groups_per_step = {groups}
checkpoint_every = 1
[eval]
episodes = 0
[log]
progress = "plain"
plots = false
[cluster]
backend = "ray"
address = "{address}"
inference_servers = 2
env_servers = 2
max_restarts = 3
"""


def placement(run_dir: Path) -> list[dict[str, Any]]:
    try:
        return list(json.loads((run_dir / "status.json").read_text()).get("placement") or [])
    except (OSError, ValueError):
        return []


def alive(run_dir: Path, piece: str) -> list[dict[str, Any]]:
    return [p for p in placement(run_dir) if p["piece"] == piece and p["state"] == "alive"]


def actor_pid(server_pid: int) -> int:
    """The Ray actor process whose child the server is."""
    return int(Path(f"/proc/{server_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.fixture
def two_nodes() -> Any:
    tc = start_cluster(cpus_per_node=4)  # room for all four pieces on one node after a loss
    try:
        yield tc
    finally:
        stop_cluster(tc)


def test_train_on_two_nodes_survives_an_inference_actor_kill_and_a_node_loss(
    two_nodes: RayTestCluster, tmp_path: Path, model_cache: Path, record_fault: Any
) -> None:
    env = agentrl_env(model_cache, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    config, run_dir = tmp_path / "ray.toml", tmp_path / "run"
    config.write_text(
        CONFIG.format(steps=STEPS, groups=GROUPS_PER_STEP, address=two_nodes.cluster.address)
    )
    train = Proc(
        [AGENTRL, "train", str(config), f'--run.out="{run_dir}"'], tmp_path / "train.log", env
    )
    try:
        wait_until(
            lambda: consumed_steps(run_dir) >= 1 and len(alive(run_dir, "inference")) == 2,
            "a step with both inference servers up",
            600,
            train,
        )
        first = placement(run_dir)
        victim = alive(run_dir, "inference")[0]
        os.kill(actor_pid(victim["pid"]), signal.SIGKILL)
        step_at_kill = consumed_steps(run_dir)
        wait_until(
            lambda: consumed_steps(run_dir) >= step_at_kill + 2,
            "two more steps after the inference actor's kill",
            600,
            train,
        )
        step_at_node_loss = consumed_steps(run_dir)
        two_nodes.cluster.remove_node(two_nodes.nodes["node_a"])
        rc = train.wait(600)
    finally:
        train.kill()
    end = audit(run_dir)
    cli = subprocess.run(
        [AGENTRL, "audit", str(run_dir)], capture_output=True, text=True, timeout=120, env=env
    )
    last = placement(run_dir)
    for fault, step in (
        ("ray: an inference-server actor killed mid-train", step_at_kill),
        ("ray: a whole node removed mid-train", step_at_node_loss),
    ):
        record_fault(
            fault,
            injected=1,
            survived=int(rc == 0 and end["ok"] and step < STEPS),
            lost=len(end["lost"]),
            trained_twice=len(end["trained_twice"]),
        )

    assert rc == 0, train.tail(60)
    assert step_at_node_loss < STEPS, "the node loss came after the last step"
    nodes = {p["piece"]: set() for p in first}
    for p in first:
        nodes[p["piece"]].add(two_nodes.node_name(p["node_id"]))
    assert nodes == {"inference": {"node_a", "node_b"}, "env": {"node_a", "node_b"}}, first
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert end["integrity"] == "ok" and end["ok"], end
    assert end["lost"] == [] and end["trained_twice"] == [], end
    assert end["consumed_steps"] == STEPS
    assert end["trained_tasks"] == STEPS * GROUPS_PER_STEP
    assert "Traceback" not in train.text(), train.tail(60)
    # Each fault hit its pieces: restarted by Ray, or still restarting when the run ended
    # (the run does not wait for them: it goes on with the servers that are up).
    by_index = {(p["piece"], p["index"]): p for p in last}
    on_node_a = [p for p in first if two_nodes.node_name(p["node_id"]) == "node_a"]
    for hit in [victim, *on_node_a]:
        now = by_index[(hit["piece"], hit["index"])]
        assert now["restarts"] >= 1 or now["state"] != "alive", (hit, now)
    assert f"inference server {victim['local_url']} is down" in train.text(), train.tail(60)
