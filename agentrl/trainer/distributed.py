"""Training across processes with ``accelerate``: the rollout loop on rank 0, math on all.

Launch one process per device (``accelerate launch``, ``torchrun``); every rank
builds the same :class:`~agentrl.trainer.trainer.Trainer` with an
``accelerate.Accelerator``. Rank 0 runs everything else (vLLM, the episode loop, the
store, publishing, checkpoints) and, for each optimizer step, broadcasts the groups
with :func:`broadcast_groups`; the other ranks run :func:`follow`. Each rank trains
on its share of the rows (``rows[rank::world]``) and the wrapper (DDP, or FSDP2 when
configured so) reduces the gradients, so one step equals the single-process step on
the same batch. Under FSDP every forward and backward gathers weights (collectives),
so every rank runs as many micro-batches as the busiest one, padding with masked-out
micro-batches.

Groups cross as JSON (token arrays as lists) in one uint8 tensor: nothing is
pickled. Under FSDP every rank joins the gathering of the full weights at the end of
each step (``accelerator.get_state_dict``, a collective) and rank 0 receives them
(on CPU), so it can publish and checkpoint them (:meth:`Trainer.full_state_dict`).

Tested on CPU with two gloo processes (``tests/trainer/test_distributed_cpu.py``),
for DDP and for FSDP2: the gradients and the weights after one AdamW step equal the
single-process step's, with uneven micro-batch counts across ranks, and rank 0 holds
the full weights. accelerate (1.15) ignores an FSDP plugin on CPU (it wraps in DDP),
so the FSDP2 test sets accelerate's state to FSDP itself; accelerate's own FSDP2
code (``prepare``, ``no_sync``, ``backward``, ``clip_grad_norm_``, ``get_state_dict``)
then runs on ``torch.distributed.fsdp.fully_shard``. Not run yet: any GPU (NCCL),
and LoRA publishing under FSDP2 (``save_pretrained`` of the sharded model). Known
gap: under FSDP2 ``save_checkpoint`` fails on rank 0 (the optimizer state it saves
holds DTensor shards; safetensors raises "Attempted to access the data pointer on
an invalid python storage").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch

from agentrl.trainer.trainer import Trainer
from agentrl.types import Group, Task, Trajectory


def _encode(groups: Sequence[Group] | None) -> bytes:
    if groups is None:
        return b"null"
    data = [
        {"task": {"task_id": g.task.task_id, "env_id": g.task.env_id, "seed": g.task.seed,
                  "options": g.task.options, "env_kwargs": g.task.env_kwargs},
         "size": g.size, "trajectories": [t.to_json() for t in g.trajectories]}
        for g in groups
    ]  # fmt: skip
    return json.dumps(data).encode()


def _decode(raw: bytes) -> list[Group] | None:
    data = json.loads(raw)
    if data is None:
        return None
    return [
        Group(Task(**g["task"]), g["size"], [Trajectory.from_json(t) for t in g["trajectories"]])
        for g in data
    ]


def broadcast_groups(groups: Sequence[Group] | None, accelerator: Any) -> list[Group] | None:
    """Rank 0 sends ``groups`` (None: stop); every rank returns what rank 0 sent."""
    import torch.distributed as dist

    device = accelerator.device
    if accelerator.process_index == 0:
        payload = torch.frombuffer(bytearray(_encode(groups)), dtype=torch.uint8).to(device)
        size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
    else:
        size = torch.zeros(1, dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    if accelerator.process_index != 0:
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.broadcast(payload, src=0)
    return _decode(payload.cpu().numpy().tobytes())


def follow(trainer: Trainer) -> int:
    """Run on ranks other than 0: train on what rank 0 broadcasts until it says stop."""
    steps = 0
    while (groups := broadcast_groups(None, trainer.accelerator)) is not None:
        trainer.train_step(groups)
        steps += 1
    return steps
