"""A whole `agentrl train` with every piece on a two-node Ray cluster (loopback), with faults.

The test builds Ray's test cluster (a head with no CPUs, two worker nodes each offering
{"node_a": 1} or {"node_b": 1}); `agentrl train` joins it (``cluster.address``) and
starts two inference servers (real ``vllm serve`` on the tiny model), two env servers
(``agentrl serve-env``), two rollout workers and a second trainer rank (gloo) as Ray
actors, spread over the nodes; the rollout workers reach the env servers themselves.
Mid-run, one inference-server actor is killed (its process, by PID), then one env-server
actor, then a whole node is removed (``cluster.remove_node``). Ray restarts the servers
on the node that is left; a rollout worker or trainer rank lost with the node stops the
run with its resume command, and ``--resume`` finishes it. ``agentrl audit`` is clean,
every task is trained exactly once, and status.json shows the placement.
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

STEPS = 10
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
workers = 2
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
trainer_ranks = 2
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
    tc = start_cluster(cpus_per_node=8)  # room for every piece on one node after a loss
    try:
        yield tc
    finally:
        stop_cluster(tc)


def _kill_one(run_dir: Path, piece: str) -> dict[str, Any]:
    """SIGKILL the Ray actor process of one alive ``piece`` server; its placement row."""
    victim = alive(run_dir, piece)[0]
    os.kill(actor_pid(victim["pid"]), signal.SIGKILL)
    return victim


def _after_steps(run_dir: Path, n: int, what: str, train: Proc) -> int:
    """Wait for ``n`` more consumed steps; the step count before them."""
    before = consumed_steps(run_dir)
    wait_until(lambda: consumed_steps(run_dir) >= before + n, what, 600, train)
    return before


def test_every_piece_on_two_nodes_survives_server_kills_and_a_node_loss(
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
    resumed: Proc | None = None
    try:
        wait_until(
            lambda: (
                consumed_steps(run_dir) >= 1
                and len(alive(run_dir, "inference")) == 2
                and len(alive(run_dir, "env")) == 2
            ),
            "a step with both inference and both env servers up",
            600,
            train,
        )
        first = placement(run_dir)
        inference = _kill_one(run_dir, "inference")
        at_inference = _after_steps(run_dir, 2, "two steps after the inference kill", train)
        env_victim = _kill_one(run_dir, "env")
        at_env = _after_steps(run_dir, 2, "two steps after the env-server kill", train)
        at_node_loss = consumed_steps(run_dir)
        two_nodes.cluster.remove_node(two_nodes.nodes["node_a"])
        rc = train.wait(600)
        if rc != 0:  # a rollout worker or a trainer rank was on the node: stop, then resume
            assert "--resume" in train.text(), train.tail(60)
            resumed = Proc(
                [AGENTRL, "train", "--resume", str(run_dir)], tmp_path / "resume.log", env
            )
            rc = resumed.wait(900)
    finally:
        train.kill()
        if resumed is not None:
            resumed.kill()
    end = audit(run_dir)
    cli = subprocess.run(
        [AGENTRL, "audit", str(run_dir)], capture_output=True, text=True, timeout=120, env=env
    )
    last = placement(run_dir)
    for fault, step in (
        ("ray: an inference-server actor killed mid-train", at_inference),
        ("ray: an env-server actor killed mid-train", at_env),
        ("ray: a whole node removed mid-train (every piece on 2 nodes)", at_node_loss),
    ):
        record_fault(
            fault,
            injected=1,
            survived=int(rc == 0 and end["ok"] and step < STEPS),
            lost=len(end["lost"]),
            trained_twice=len(end["trained_twice"]),
        )

    log = train.text() + (resumed.text() if resumed is not None else "")
    assert rc == 0, (resumed or train).tail(60)
    assert at_node_loss < STEPS, "the node loss came after the last step"
    nodes: dict[str, set[str]] = {}
    for p in first:
        nodes.setdefault(p["piece"], set()).add(two_nodes.node_name(p["node_id"]))
    assert nodes["inference"] == nodes["env"] == {"node_a", "node_b"}, first
    assert nodes["worker"] == {"node_a", "node_b"}, first  # spread, as the servers
    assert sorted(p["index"] for p in first if p["piece"] == "trainer") == [0, 1], first
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert end["integrity"] == "ok" and end["ok"], end
    assert end["lost"] == [] and end["trained_twice"] == [], end
    assert end["consumed_steps"] == STEPS
    assert end["trained_tasks"] == STEPS * GROUPS_PER_STEP
    assert "Traceback" not in log, (resumed or train).tail(60)
    assert f"inference server {inference['local_url']} is down" in train.text(), train.tail(60)
    if resumed is None:  # the servers hit were restarted by Ray (or still restarting)
        by_index = {(p["piece"], p["index"]): p for p in last}
        for hit in (inference, env_victim):
            now = by_index[(hit["piece"], hit["index"])]
            assert now["restarts"] >= 1 or now["state"] != "alive", (hit, now)
