"""Training across processes with ``accelerate``: the rollout loop on rank 0, math on all.

Launch one process per device (``accelerate launch``, ``torchrun``); every rank
builds the same :class:`~agentrl.trainer.trainer.Trainer` with an
``accelerate.Accelerator``. Rank 0 runs everything else (vLLM, the episode loop, the
store, publishing, checkpoints) and, for each optimizer step, broadcasts the groups
with :func:`broadcast_groups`; the other ranks run :func:`follow_run` (the trainer,
restored from the run's checkpoint on resume, then :func:`follow`). Each rank trains
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
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.config import RunConfig
from agentrl.errors import ConfigError
from agentrl.types import Group, Task, Trajectory

if TYPE_CHECKING:
    from agentrl.trainer.trainer import Trainer

# torch and the trainer are imported where used: `agentrl train` asks for
# launched_rank() before it knows whether it needs them.


def launched_rank() -> tuple[int, int]:
    """(rank, world size) set by ``accelerate launch`` or ``torchrun``; (0, 1) otherwise."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def make_accelerator(device: str = "auto") -> Any:
    """An ``accelerate.Accelerator`` for this launched process (CPU/gloo without CUDA, or
    with ``trainer.device = "cpu"``).

    Its plugins (DDP, FSDP2) come from the ``accelerate launch`` config.
    """
    import torch
    from accelerate import Accelerator

    return Accelerator(cpu=device == "cpu" or not torch.cuda.is_available())


def launched_config(config_path: str | Path | None, overrides: list[str], *,
                    resume: str | None) -> tuple[RunConfig, Path]:  # fmt: skip
    """The config and run directory of ``agentrl train`` launched on several processes.

    Every rank must agree on the run directory, so a new run needs ``run.out``; with
    ``resume`` (a run directory), the config recorded there. Checks nothing else and
    creates nothing (rank 0 then prepares the run as a single process does).

    Raises:
        ConfigError: a new run without ``run.out``.
    """
    if resume is not None:
        return RunConfig.load(Path(resume) / "config.toml", overrides), Path(resume)
    config = RunConfig.load(config_path, overrides)
    if not config.run.out:
        raise ConfigError(
            "a run launched on several processes needs run.out (all ranks must agree "
            "on the run directory): add --run.out=DIR"
        )
    return config, Path(config.run.out)


def start_distributed(config: RunConfig) -> Any:
    """Join the launched processes: the model first, then ``torch.distributed``.

    Builds the tiny model (if the config asks for it) before torch.distributed
    starts: once it has, transformers writes model files only on rank 0. Returns this
    process's ``accelerate.Accelerator``.
    """
    from agentrl.models import resolve_model

    resolve_model(config.model.path)
    return make_accelerator(config.trainer.device)


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
    import torch
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


def follow_run(config: RunConfig, run_dir: Path, *, resume: bool, accelerator: Any) -> int:
    """A rank other than 0 of ``agentrl train``: the same trainer, fed by rank 0's
    broadcasts; no vLLM, no store, no output.

    With ``resume`` it loads the run's latest checkpoint, the one rank 0 loads.
    Returns the number of optimizer steps taken.

    Raises:
        ConfigError: resuming a run trained with FSDP2 (its checkpoints are not written).
    """
    from agentrl.env import import_env_modules, load_env_plugins
    from agentrl.models import resolve_model
    from agentrl.trainer.checkpoint import latest_checkpoint, load_checkpoint
    from agentrl.trainer.trainer import Trainer

    load_env_plugins()
    import_env_modules(config.env.imports)
    trainer = Trainer(resolve_model(config.model.path), config.trainer,
                      temperature=config.rollout.temperature, seed=config.run.seed,
                      accelerator=accelerator)  # fmt: skip
    if resume:
        folder = latest_checkpoint(run_dir / "checkpoints")
        if folder is not None:
            if trainer.sharded:
                raise ConfigError(
                    "resuming a run trained with FSDP2 is not supported yet (its optimizer "
                    "checkpoint is not written); start a new run, or train with DDP"
                )
            load_checkpoint(trainer, folder)  # rank 0 loads the same checkpoint
    return follow(trainer)
