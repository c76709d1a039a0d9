"""A real two-node Ray cluster on this machine (Ray's own test utilities, loopback only).

The head offers no CPUs, so every actor lands on one of the two worker nodes; each node
offers one CPU and a resource of its own ({"node_a": 1}, {"node_b": 1}), so where an
actor ran is checkable. The cluster is shut down by the fixture's finalizer whatever
the test did.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# Ray reads this when first imported: keep every address of the test cluster on 127.0.0.1.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture(autouse=True)
def _environment_restored() -> Iterator[None]:
    """Put this process's environment back after each test: a rank-0 hook sets RANK,
    WORLD_SIZE and MASTER_ADDR here, and any later test that builds an accelerate or
    transformers trainer would wait forever in a rendezvous with a rank that is gone."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@dataclass
class RayTestCluster:
    """The running cluster: Ray's ``Cluster`` and its two worker nodes."""

    cluster: Any
    nodes: dict[str, Any]
    """"node_a" / "node_b" -> the node (its ``node_id``)."""

    def node_name(self, node_id: str) -> str:
        """ "node_a" / "node_b", or "head" (the head node, where the driver runs)."""
        return next((name for name, n in self.nodes.items() if n.node_id == node_id), "head")


def start_cluster(cpus_per_node: int = 1) -> RayTestCluster:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
    )
    nodes = {
        name: cluster.add_node(num_cpus=cpus_per_node, resources={name: 1})
        for name in ("node_a", "node_b")
    }
    ray.init(address=cluster.address, log_to_driver=False)
    return RayTestCluster(cluster, nodes)


def stop_cluster(tc: RayTestCluster) -> None:
    import ray

    try:
        ray.shutdown()
    finally:
        tc.cluster.shutdown()


@pytest.fixture
def ray_cluster() -> Iterator[RayTestCluster]:
    tc = start_cluster()
    try:
        yield tc
    finally:
        stop_cluster(tc)


@pytest.fixture(scope="module")
def head_and_node2() -> Iterator[Any]:
    """A started two-node cluster whose head takes work too: the head offers
    ``{head: 1}``, the second node ``{node2: 1}`` (one CPU each), so a piece that asks for
    one of them lands on that node; the trainer-rank and worker tests connect with
    ``ray.init(address=cluster.address)``. Shut down when the module's tests are done."""
    from ray.cluster_utils import Cluster

    args = {
        "num_cpus": 1,
        "include_dashboard": False,
        "object_store_memory": 80 * 2**20,
    }
    cluster = Cluster(initialize_head=True, head_node_args={**args, "resources": {"head": 1}})
    try:
        cluster.add_node(**args, resources={"node2": 1})
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


def node_of(cluster: Any, pid: int) -> str:
    """The id of the node of ``cluster`` (Ray's ``Cluster``) that process ``pid`` runs on,
    known apart from what Ray's runtime context says: the node's raylet started it."""
    return raylet_node(cluster, parent_of(pid))


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def raylet_node(cluster: Any, raylet_pid: int) -> str:
    """The id of the node of ``cluster`` whose raylet is process ``raylet_pid``."""
    for node in (cluster.head_node, *cluster.worker_nodes):
        if raylet_pid in [p.process.pid for p in node.all_processes.get("raylet", [])]:
            return str(node.node_id)
    raise AssertionError(f"process {raylet_pid} is no raylet of the test cluster")
