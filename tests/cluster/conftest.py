"""A local Ray cluster of two nodes on this machine (loopback), for the cluster tests.

The head node offers ``{head: 1}``, the second ``{node2: 1}``: a piece that asks for one
of them lands on that node. One CPU each (the machine has few). Shut down when the
module's tests are done.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """A started two-node cluster (``ray.cluster_utils.Cluster``); tests connect with
    ``ray.init(address=cluster.address)``."""
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
