"""Rank 0 of a two-rank trainer on a Ray cluster, as a script (``python -m
tests.cluster.rank0 ADDRESS MODEL OUT``): the rank actor starts through
:func:`agentrl.cluster.ranks.start_ranks`, one optimizer step on synthetic groups, and
rank 0's weights, gradients and the placement (``where()`` and the status rows) go to OUT
(a separate process: the test's own stays out of torch.distributed)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import ray
import torch
from safetensors.torch import save_file

from agentrl.cluster.ranks import start_ranks
from agentrl.config import ClusterConfig, ModelConfig, RunConfig
from agentrl.trainer.distributed import broadcast_groups, launched_rank, start_distributed
from agentrl.trainer.trainer import Trainer
from tests.cluster.conftest import parent_of
from tests.trainer.test_checkpoint import synthetic_groups
from tests.trainer.test_distributed_cpu import CONFIG


def main(address: str, model: str, out: str) -> None:
    ray.init(address=address)
    cluster = ClusterConfig(
        backend="ray", trainer_ranks=2, trainer_resources={"CPU": 1, "node2": 1}
    )
    config = RunConfig(model=ModelConfig(path=model), trainer=CONFIG, cluster=cluster)
    ranks = start_ranks(config, Path(out), resume=False)
    assert launched_rank() == (0, 2)
    torch.set_num_threads(1)
    trainer = Trainer(
        model,
        CONFIG,
        temperature=config.rollout.temperature,
        seed=config.run.seed,
        accelerator=start_distributed(config),
    )
    stats = trainer.train_step(
        broadcast_groups(synthetic_groups(4, groups=3, size=3), trainer.accelerator)
    )
    rows = ranks.placement()  # while rank 1 still follows
    broadcast_groups(None, trainer.accelerator)  # release the follower
    state = {k: v.contiguous() for k, v in trainer.full_state_dict().items()}
    state.update(
        {
            f"grad.{k}": p.grad.contiguous()
            for k, p in trainer.unwrapped.named_parameters()
            if p.grad is not None
        }
    )
    save_file(state, f"{out}/rank0.safetensors", metadata={"loss": str(stats.loss)})
    placement = {
        "rank0": ray.get_runtime_context().get_node_id(),
        "ranks": ranks.where(),
        "rows": rows,
        "pid": os.getpid(),
    }
    # the parent of each rank actor's process: the raylet of the node it really runs on
    placement["parents"] = [parent_of(r["pid"]) for r in placement["ranks"]]
    ranks.close()
    placement["steps"] = ranks.steps
    Path(out, "placement.json").write_text(json.dumps(placement))
    torch.distributed.destroy_process_group()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)  # no interpreter teardown (see tests/trainer/test_distributed_cpu.leave_group)


if __name__ == "__main__":
    main(*sys.argv[1:4])
