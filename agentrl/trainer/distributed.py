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
pickled (:mod:`agentrl.trainer.channel`). Under FSDP2 rank 0 also sends, through
the same channel, a request to join a trainer checkpoint: gathering the sharded
weights and optimizer state is a collective (:mod:`agentrl.trainer.checkpoint`).
Under FSDP every rank joins the gathering of the full weights at the end of
each step (``accelerator.get_state_dict``, a collective) and rank 0 receives them
(on CPU), so it can publish and checkpoint them (:meth:`Trainer.full_state_dict`).

Tested on CPU with two gloo processes (``tests/trainer/test_distributed_cpu.py``),
for DDP and for FSDP2: the gradients and the weights after one AdamW step equal the
single-process step's, with uneven micro-batch counts across ranks, and rank 0 holds
the full weights. accelerate (1.15) ignores an FSDP plugin on CPU (it wraps in DDP),
so the FSDP2 test sets accelerate's state to FSDP itself; accelerate's own FSDP2
code (``prepare``, ``no_sync``, ``backward``, ``clip_grad_norm_``, ``get_state_dict``)
then runs on ``torch.distributed.fsdp.fully_shard``. ``test_fsdp2_checkpoint.py``
there covers LoRA under FSDP2 (the step equals one process's, the adapter rank 0
publishes) and FSDP2 checkpoints (full and LoRA: saved at step k and resumed, a run
ends where the uninterrupted run does). Not run yet: any GPU (NCCL). Under FSDP2 the final
checkpoint ``agentrl train`` writes after the loop (at a step that is not a
multiple of ``train.checkpoint_every``) is skipped: the other ranks have stopped
following by then; ``--resume`` goes on from the last periodic checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.config import RunConfig
from agentrl.errors import ConfigError
from agentrl.trainer.channel import CheckpointRequest, broadcast, broadcast_groups

__all__ = [
    "broadcast_groups",
    "follow",
    "follow_run",
    "launched_config",
    "launched_rank",
    "make_accelerator",
    "start_distributed",
]

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


def launched_config(
    config_path: str | Path | None, overrides: list[str], *, resume: str | None
) -> tuple[RunConfig, Path]:
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


def follow(trainer: Trainer) -> int:
    """Run on ranks other than 0: train on what rank 0 broadcasts until it says stop,
    joining the checkpoints it asks for; return the number of steps taken."""
    from agentrl.trainer.checkpoint import save_checkpoint

    steps = 0
    while (message := broadcast(None, trainer.accelerator)) is not None:
        if isinstance(message, CheckpointRequest):
            save_checkpoint(trainer, Path(message.root), message.keep)
            continue
        trainer.train_step(message)
        steps += 1
    return steps


def follow_run(config: RunConfig, run_dir: Path, *, resume: bool, accelerator: Any) -> int:
    """A rank other than 0 of ``agentrl train``: the same trainer, fed by rank 0's
    broadcasts; no vLLM, no store, no output.

    With ``resume`` it loads the run's latest checkpoint, the one rank 0 loads (under
    FSDP2 together with rank 0: a collective). Returns the number of optimizer steps
    taken.
    """
    from agentrl.env import import_env_modules, load_env_plugins
    from agentrl.models import resolve_model
    from agentrl.trainer.checkpoint import latest_checkpoint, load_checkpoint
    from agentrl.trainer.trainer import Trainer

    load_env_plugins()
    import_env_modules(config.env.imports)
    trainer = Trainer(
        resolve_model(config.model.path),
        config.trainer,
        temperature=config.rollout.temperature,
        seed=config.run.seed,
        accelerator=accelerator,
    )
    if resume:
        folder = latest_checkpoint(run_dir / "checkpoints")
        if folder is not None:
            load_checkpoint(trainer, folder)  # rank 0 loads the same checkpoint
    return follow(trainer)
