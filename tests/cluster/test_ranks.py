"""Trainer ranks as Ray actors: rank 0 in the launching process, rank 1 an actor on the
other node of a real two-node Ray cluster (gloo), one optimizer step equal to one
process's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.trainer.trainer import Trainer
from tests.cluster.conftest import node_of, raylet_node
from tests.trainer.test_checkpoint import synthetic_groups
from tests.trainer.test_distributed_cpu import CONFIG

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_a_rank_actor_on_another_node_takes_the_one_process_step(
    head_and_node2: Any, tiny_model: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.cluster.rank0",
            head_and_node2.address,
            str(tiny_model),
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        timeout=200,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    placement = json.loads((tmp_path / "placement.json").read_text())
    node2 = [n["NodeID"] for n in _nodes(head_and_node2) if n["Resources"].get("node2")]
    assert [r["node_id"] for r in placement["ranks"]] == node2, "rank 1 runs on the node2 node"
    assert placement["rank0"] != node2[0], "rank 0 (the launching process) on the other one"
    # status.json's rows: rank 0 this process on the head, rank 1 where its process runs
    rank0, rank1 = placement["rows"]
    assert (rank0["piece"], rank0["index"], rank0["state"]) == ("trainer", 0, "alive")
    assert rank0["pid"] == placement["pid"]
    assert rank0["node_id"] == head_and_node2.head_node.node_id == placement["rank0"]
    assert (rank1["piece"], rank1["index"], rank1["state"]) == ("trainer", 1, "alive")
    assert [rank1["node_id"]] == node2 == [raylet_node(head_and_node2, placement["parents"][0])]
    assert rank1["pid"] == placement["ranks"][0]["pid"] and rank1["node_ip"] == "127.0.0.1"
    assert placement["steps"] == [1], "rank 1 took the one step, then rank 0 released it"
    two = load_file(tmp_path / "rank0.safetensors")
    single = Trainer(str(tiny_model), CONFIG, temperature=1.0, seed=0)
    initial = {k: v.clone() for k, v in single.model.state_dict().items()}
    single.train_step(synthetic_groups(4, groups=3, size=3))
    one = single.model.state_dict()
    grads = {k: p.grad for k, p in single.model.named_parameters() if p.grad is not None}
    assert set(grads) == {k[5:] for k in two if k.startswith("grad.")}
    gworst = max(
        ((grads[k] - two[f"grad.{k}"]).abs().max() / (grads[k].abs().max() + 1e-12)).item()
        for k in grads
    )
    assert len([k for k in one if not torch.equal(one[k], initial[k])]) > 10
    worst = max((one[k] - two[k]).abs().max().item() for k in one)
    # as in tests/trainer/test_distributed_cpu.py: summation order differs across ranks
    assert gworst < 1e-4 and worst < 1e-2 * CONFIG.lr, (gworst, worst)


def _nodes(cluster: Any) -> list[dict[str, Any]]:
    import ray

    ray.init(address=cluster.address)
    try:
        return [n for n in ray.nodes() if n["Alive"]]
    finally:
        ray.shutdown()


@pytest.mark.timeout(120)
def test_a_dead_rank_actor_stops_the_run_with_one_error(
    head_and_node2: Any, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading
    import time

    import ray

    from agentrl.cluster.ranks import start_ranks
    from agentrl.config import ClusterConfig, ModelConfig, RunConfig
    from agentrl.errors import InfraError

    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)  # start_ranks sets them in this process
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    cluster = ClusterConfig(backend="ray", trainer_ranks=2, trainer_resources={"node2": 1})
    config = RunConfig(model=ModelConfig(path=str(tiny_model)), cluster=cluster)
    failures: list[InfraError] = []
    died = threading.Event()
    ray.init(address=head_and_node2.address)
    try:
        ranks = start_ranks(
            config, tmp_path, resume=False, on_death=lambda e: (failures.append(e), died.set())
        )
        assert os.environ["RANK"] == "0" and os.environ["WORLD_SIZE"] == "2"
        (where,) = ranks.where()  # the actor waits in the rendezvous for rank 0
        rank0, rank1 = ranks.placement()
        assert (rank0["pid"], rank0["node_id"]) == (os.getpid(), head_and_node2.head_node.node_id)
        assert rank1["state"] == "alive" and rank1["pid"] == where["pid"]
        assert rank1["node_id"] == node_of(head_and_node2, where["pid"]) != rank0["node_id"]
        os.kill(where["pid"], 9)
        assert died.wait(60), "the watcher saw the rank die"
        deadline = time.monotonic() + 10  # the row's future is set beside the watcher
        while ranks.placement()[1]["state"] != "dead" and time.monotonic() < deadline:
            time.sleep(0.05)
        rank1 = ranks.placement()[1]
        assert rank1["state"] == "dead" and "died" in rank1["reason"].lower(), rank1
        assert rank1["node_id"] == where["node_id"]  # where it was
        with pytest.raises(InfraError, match="trainer rank 1 of 2"):
            ranks.check()
        assert len(failures) == 1 and "resumes from its last checkpoint" in str(failures[0])
        ranks.close(released=False)
    finally:
        ray.shutdown()
