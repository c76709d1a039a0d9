"""What rank 0 sends the other ranks of a multi-process trainer, and how.

One message at a time, broadcast from rank 0 (a collective every rank joins): the
groups of the next optimizer step, a request to join a trainer checkpoint (under
FSDP2 gathering the sharded state is a collective), or stop (``None``). Messages
cross as JSON (token arrays as lists) in one uint8 tensor: nothing is pickled.
Who sends and who follows is :mod:`agentrl.trainer.distributed`'s; what a
checkpoint holds, :mod:`agentrl.trainer.checkpoint`'s.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

from agentrl.types import Group, Task, Trajectory


@dataclasses.dataclass(frozen=True, slots=True)
class CheckpointRequest:
    """Rank 0 asks the other ranks to join :func:`~agentrl.trainer.checkpoint.save_checkpoint`."""

    root: str
    keep: int


Message = list[Group] | CheckpointRequest | None
"""What rank 0 sends the other ranks: the groups of a step, a checkpoint, or stop."""


def _encode(groups: Sequence[Group] | CheckpointRequest | None) -> bytes:
    if groups is None:
        return b"null"
    if isinstance(groups, CheckpointRequest):
        return json.dumps({"checkpoint": dataclasses.asdict(groups)}).encode()
    data = [
        {
            "task": {
                "task_id": g.task.task_id,
                "env_id": g.task.env_id,
                "seed": g.task.seed,
                "options": g.task.options,
                "env_kwargs": g.task.env_kwargs,
            },
            "size": g.size,
            "trajectories": [t.to_json() for t in g.trajectories],
        }
        for g in groups
    ]
    return json.dumps(data).encode()


def _decode(raw: bytes) -> Message:
    data = json.loads(raw)
    if data is None:
        return None
    if isinstance(data, dict):
        return CheckpointRequest(**data["checkpoint"])
    return [
        Group(Task(**g["task"]), g["size"], [Trajectory.from_json(t) for t in g["trajectories"]])
        for g in data
    ]


def broadcast_groups(groups: Sequence[Group] | None, accelerator: Any) -> list[Group] | None:
    """Rank 0 sends ``groups`` (None: stop); every rank returns what rank 0 sent.

    Raises:
        RuntimeError: rank 0 sent a checkpoint request (the followers'
            :func:`~agentrl.trainer.distributed.follow` takes those).
    """
    message = broadcast(groups, accelerator)
    if isinstance(message, CheckpointRequest):
        raise RuntimeError(f"expected groups from rank 0, got {message}")
    return message


def request_checkpoint(root: str | os.PathLike[str], keep: int, accelerator: Any) -> None:
    """Rank 0: have the other ranks (in :func:`~agentrl.trainer.distributed.follow`)
    join the checkpoint it writes."""
    broadcast(CheckpointRequest(str(root), keep), accelerator)


def broadcast(message: Sequence[Group] | CheckpointRequest | None, accelerator: Any) -> Message:
    """Rank 0 sends ``message``; every rank returns what rank 0 sent."""
    import torch
    import torch.distributed as dist

    device = accelerator.device
    if accelerator.process_index == 0:
        payload = torch.frombuffer(bytearray(_encode(message)), dtype=torch.uint8).to(device)
        size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
    else:
        size = torch.zeros(1, dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    if accelerator.process_index != 0:
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.broadcast(payload, src=0)
    return _decode(payload.cpu().numpy().tobytes())
