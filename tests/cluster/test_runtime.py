"""The Ray runtime's small pieces, and the core staying free of Ray (no cluster started)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agentrl.cluster.runtime import RAY_MISSING, Placement, actor_options
from agentrl.config.cluster import ClusterConfig

pytestmark = pytest.mark.timeout(60)


def test_resources_become_ray_actor_options_with_one_cpu_by_default() -> None:
    spread = {"scheduling_strategy": "SPREAD"}  # pieces of a kind over the nodes
    assert actor_options({}) == {"num_cpus": 1.0, "num_gpus": 0.0, **spread}
    assert actor_options({"GPU": 1, "CPU": 2, "node_a": 0.5}) == {
        "num_cpus": 2.0,
        "num_gpus": 1.0,
        "resources": {"node_a": 0.5},
        **spread,
    }


def test_a_placement_row_is_what_status_json_shows() -> None:
    row = Placement("env", 1, node_ip="10.0.0.5", state="alive", restarts=2).as_dict()
    assert row["piece"] == "env" and row["index"] == 1 and row["restarts"] == 2
    assert set(row) >= {"node_id", "node_ip", "url", "local_url", "pid", "state", "reason"}


def test_without_ray_the_run_says_which_extra_to_install() -> None:
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from agentrl.cluster.runtime import open_ray\n"
        "from agentrl.config.cluster import ClusterConfig\n"
        "try:\n"
        "    with open_ray(ClusterConfig(backend='ray', address='local')): pass\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == f"ConfigError {RAY_MISSING}", out.stdout + out.stderr


def test_the_core_and_a_local_run_never_import_ray() -> None:
    code = (
        "import sys, agentrl, agentrl.run, agentrl.status, agentrl.monitor, agentrl.cluster.start\n"
        "print('ray' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
    assert ClusterConfig().backend == "local"
