"""Two trainer processes (gloo, CPU) take the same optimizer step as one process, with
DDP and with FSDP2, and rank 0 gets the full weights (what publishing needs)."""

from __future__ import annotations

import faulthandler
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from agentrl.config import LossConfig, TrainerConfig
from agentrl.inference.server import free_port
from agentrl.trainer.trainer import Trainer
from tests.trainer.test_checkpoint import synthetic_groups

# Rank 0 gets 5 rows in 4 micro-batches, rank 1 4 rows in 2: under FSDP rank 1 pads.
CONFIG = TrainerConfig(lr=1e-2, micro_batch_tokens=24, loss=LossConfig("grpo"))


def _accelerator(mode: str):  # -> accelerate.Accelerator
    from accelerate import Accelerator, FullyShardedDataParallelPlugin

    if mode == "ddp":
        return Accelerator(cpu=True)
    # accelerate (1.15) ignores an FSDP plugin on CPU: the state says MULTI_CPU and
    # `prepare` wraps in DDP. Set the state as accelerate does on GPUs (AcceleratorState,
    # and PartialState, which every later AcceleratorState() copies), so `prepare`,
    # `no_sync`, `backward`, `clip_grad_norm_` and `get_state_dict` take their FSDP2 paths.
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    accelerator.state.fsdp_plugin = plugin
    accelerator.state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    assert accelerator.is_fsdp2
    return accelerator


def leave_group() -> None:
    """End a spawned rank: leave the gloo group with its peer, then exit without the
    interpreter's teardown.

    A rank that exits while its peer still holds the group open, or that runs the
    interpreter's teardown at all, can die in std::terminate (SIGABRT, "terminate called
    without an active exception"): faulthandler caught one in ``make soak`` at
    interpreter exit, after the rank's work, from a native thread (a libtorch thread
    still joinable when the process's static objects were destroyed). This file's FSDP2
    case died the same way in fresh-clone runs of the whole suite, the project's CI
    among them: once before its ranks had the barrier and the destroy, twice after,
    without ``os._exit`` (rank 1; nothing printed after loading the weights, which is
    also the last thing a rank prints when all goes well).
    """
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


def _rank(rank: int, world: int, model: str, out: str, port: int, mode: str) -> None:
    faulthandler.enable(all_threads=True)  # Python stacks if a rank dies of a signal
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
    )
    from safetensors.torch import save_file
    from torch.distributed.tensor import DTensor

    from agentrl.trainer.distributed import broadcast_groups, follow

    torch.set_num_threads(1)
    trainer = Trainer(model, CONFIG, temperature=1.0, seed=0, accelerator=_accelerator(mode))
    sharded = isinstance(next(trainer.model.parameters()), DTensor)
    assert trainer._sharded() == sharded == (mode == "fsdp2")
    if rank == 0:
        groups = broadcast_groups(synthetic_groups(4, groups=3, size=3), trainer.accelerator)
        stats = trainer.train_step(groups)
        broadcast_groups(None, trainer.accelerator)  # release the followers
    else:
        assert follow(trainer) == 1
    # Sharded gradients are gathered for the comparison (a collective: every rank).
    grads = {
        f"grad.{k}": p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        for k, p in trainer.unwrapped.named_parameters()
        if p.grad is not None
    }
    if rank == 0:
        state = trainer.full_state_dict()  # what the publisher and checkpoints save
        assert state and not any(isinstance(v, DTensor) for v in state.values())
        state = {k: v.contiguous() for k, v in state.items()}
        state.update({k: v.contiguous() for k, v in grads.items()})
        save_file(state, f"{out}/rank0.safetensors", metadata={"loss": str(stats.loss)})
    leave_group()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_two_gloo_processes_equal_one_process(tiny_model: Path, tmp_path: Path, mode: str) -> None:
    from safetensors.torch import load_file

    mp.spawn(
        _rank, args=(2, str(tiny_model), str(tmp_path), free_port(), mode), nprocs=2, join=True
    )
    two = load_file(tmp_path / "rank0.safetensors")
    single = Trainer(str(tiny_model), CONFIG, temperature=1.0, seed=0)
    initial = {k: v.clone() for k, v in single.model.state_dict().items()}
    single.train_step(synthetic_groups(4, groups=3, size=3))
    one = single.model.state_dict()
    assert set(one) == {k for k in two if not k.startswith("grad.")}, "rank 0 has every weight"
    grads = {k: p.grad for k, p in single.model.named_parameters() if p.grad is not None}
    assert set(grads) == {k[5:] for k in two if k.startswith("grad.")}
    gworst = max(
        ((grads[k] - two[f"grad.{k}"]).abs().max() / (grads[k].abs().max() + 1e-12)).item()
        for k in grads
    )
    print(f"\n{mode}: max relative gradient difference: {gworst:.2e}")
    changed = [k for k in one if not torch.equal(one[k], initial[k])]
    assert len(changed) > 10, "the step changed the weights"
    worst = max((one[k] - two[k]).abs().max().item() for k in one)
    print(f"{mode}: max |one process - two processes| over all parameters: {worst:.2e}")
    # Adam's first step is about lr * sign(grad): float noise in near-zero gradients
    # (summation order differs across processes) shows as up to ~1e-3 of lr.
    assert gworst < 1e-4 and worst < 1e-2 * CONFIG.lr
