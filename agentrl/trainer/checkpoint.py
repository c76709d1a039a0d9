"""Trainer checkpoints: exact, atomic, no pickle.

A checkpoint is a folder ``step-000012/`` in the run's ``checkpoints/``:

* ``model.safetensors`` (full weights) or ``adapter_model.safetensors`` plus
  ``adapter_config.json`` (LoRA: only the adapter);
* ``optimizer.safetensors``: every optimizer state tensor (``state.<param>.<name>``);
* ``rng.safetensors``: torch's RNG state;
* ``trainer.json``: step, version, the optimizer's param groups and scalar state, the
  Python and numpy RNG states, and the trainer config.

It is written to a temporary folder and renamed into place, then ``latest`` (a text
file naming the folder) is replaced atomically, so a kill at any moment leaves the
previous checkpoint intact. Loading restores parameters, optimizer moments, step,
version and RNG states exactly.

Under FSDP2 (weights and optimizer moments sharded across ranks) the layout is the
same, so a checkpoint loads at any world size: every rank joins the gathering of the
full model and optimizer state onto rank 0's CPU
(``torch.distributed.checkpoint.state_dict.get_state_dict`` with ``full_state_dict``;
rank 0 asks the other ranks to join, :func:`~agentrl.trainer.channel.request_checkpoint`),
and only rank 0 writes; loading, every rank reads the files and
``set_state_dict`` keeps each rank's shard. Optimizer state is keyed by parameter
index (the order of the trainable parameters), as ``torch.optim`` numbers it.

:func:`save_model` writes the final weights once more, as a model folder that
transformers and vLLM load (a LoRA run: the adapter, with peft's files), replaced
atomically the same way.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.errors import ConfigError, RunDirError
from agentrl.jsondata import jsonable
from agentrl.trainer.tied import retied, untied
from agentrl.trainer.trainer import Trainer

LATEST = "latest"


def save_checkpoint(trainer: Trainer, root: Path, keep: int = 2) -> Path:
    """Write a checkpoint of ``trainer`` under ``root``; return its folder.

    Raises:
        RunDirError: it could not be written (disk full, read-only, no permission);
            the half-written folder is removed and the previous checkpoint is intact.
    """
    try:
        return _write_checkpoint(trainer, root, keep)
    except Exception as e:
        for tmp in Path(root).glob(f".*.tmp-{os.getpid()}"):  # what this attempt wrote
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink(missing_ok=True)
        if isinstance(e, ConfigError):
            raise
        raise RunDirError(
            f"writing the checkpoint of step {trainer.step} under {str(root)!r} failed: "
            f"{type(e).__name__}: {e}. The previous checkpoint is intact; free space or make "
            f"the folder writable, then continue with agentrl train --resume RUN_DIR"
        ) from e


def _write_checkpoint(trainer: Trainer, root: Path, keep: int) -> Path:
    from safetensors.torch import save_file

    root = Path(root)
    name = f"step-{trainer.step:06d}"
    final = root / name
    full, opt = _gathered_state(trainer, root, keep) if trainer.sharded else (None, None)
    if trainer.rank != 0:  # FSDP: the other ranks took part in the gathering only
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model = trainer.unwrapped
    if trainer.is_lora:
        model.save_pretrained(tmp, **({} if full is None else {"state_dict": full}))
    else:
        state = {k: v.contiguous() for k, v in (full or trainer.full_state_dict()).items()}
        save_file(untied(state), tmp / "model.safetensors")
    opt = opt if opt is not None else trainer.optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, state in opt["state"].items():
        for key, value in state.items():
            if torch.is_tensor(value):
                tensors[f"state.{index}.{key}"] = value.detach().contiguous()
            else:
                scalars.setdefault(str(index), {})[key] = value
    if tensors:
        save_file(tensors, tmp / "optimizer.safetensors")
    save_file({"torch": torch.get_rng_state()}, tmp / "rng.safetensors")
    np_state = np.random.get_state()
    meta = {
        "step": trainer.step,
        "version": trainer.version,
        "param_groups": opt["param_groups"],
        "optimizer_scalars": scalars,
        "python_rng": jsonable(random.getstate()),
        "numpy_rng": [np_state[0], np_state[1].tolist(), *map(_plain, np_state[2:])],
        "config": jsonable(dataclasses.asdict(trainer.config)),
        "model_path": trainer.model_path,
        "written_at": time.time(),
    }
    (tmp / "trainer.json").write_text(json.dumps(meta, indent=1))
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    pointer = root / f".{LATEST}.tmp-{os.getpid()}"
    pointer.write_text(name + "\n")
    os.replace(pointer, root / LATEST)
    for old in sorted(p for p in root.glob("step-*") if p.name != name)[: -keep or None]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _gathered_state(
    trainer: Trainer, root: Path, keep: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Under FSDP: the full model state and the optimizer state (keyed by parameter
    index, as ``Optimizer.state_dict`` keys it) on rank 0's CPU; the other ranks get
    empty ones. A collective: rank 0 first asks the other ranks to join.

    Raises:
        RuntimeError: the optimizer's parameters are not the trainable parameters in
            model order (the index layout would not mean the same parameters).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from agentrl.trainer.channel import request_checkpoint

    if trainer.rank == 0:
        request_checkpoint(root, keep, trainer.accelerator)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full, optim = get_state_dict(trainer.model, _optimizer(trainer), options=options)
    if trainer.rank != 0:
        return {}, {}
    names = [n for group in optim["param_groups"] for n in group["params"]]
    if names != _trainable_names(trainer):
        raise RuntimeError(
            f"the optimizer's {len(names)} parameters are not the model's "
            f"{len(_trainable_names(trainer))} trainable parameters in order"
        )
    index = {n: i for i, n in enumerate(names)}
    return full, {
        "state": {index[n]: state for n, state in optim["state"].items()},
        "param_groups": [
            {**g, "params": [index[n] for n in g["params"]]} for g in optim["param_groups"]
        ],
    }


def _optimizer(trainer: Trainer) -> Any:
    """The torch optimizer (accelerate wraps it)."""
    return getattr(trainer.optimizer, "optimizer", trainer.optimizer)


def _trainable_names(trainer: Trainer) -> list[str]:
    """Names of the trainable parameters, in the order the optimizer holds them."""
    return [n for n, p in trainer.model.named_parameters() if p.requires_grad]


def latest_checkpoint(root: Path) -> Path | None:
    pointer = Path(root) / LATEST
    if not pointer.exists():
        return None
    folder = Path(root) / pointer.read_text().strip()
    return folder if folder.is_dir() else None


def load_checkpoint(trainer: Trainer, folder: Path) -> None:
    """Restore weights (or adapter), optimizer, step, version and RNG states.

    Under FSDP a collective: every rank loads the same folder.
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    meta_path = folder / "trainer.json"
    if not meta_path.exists():
        raise ConfigError(f"{str(folder)!r} is not a trainer checkpoint (no trainer.json)")
    meta = json.loads(meta_path.read_text())
    opt_state = _optimizer_state(folder, meta)
    if trainer.sharded:
        _load_sharded(trainer, folder, opt_state)
    else:
        _load_local(trainer, folder, opt_state)
    torch.set_rng_state(load_file(folder / "rng.safetensors")["torch"])
    random.setstate(_tuples(meta["python_rng"]))
    kind, keys, *rest = meta["numpy_rng"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    trainer.step = int(meta["step"])
    trainer.set_version(int(meta["version"]))


def _optimizer_state(folder: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """The optimizer state dict a checkpoint holds, keyed by parameter index."""
    from safetensors.torch import load_file

    opt_state: dict[str, Any] = {"state": {}, "param_groups": meta["param_groups"]}
    if (folder / "optimizer.safetensors").exists():
        for key, value in load_file(folder / "optimizer.safetensors").items():
            _, index, name = key.split(".", 2)
            opt_state["state"].setdefault(int(index), {})[name] = value
    for index, values in meta["optimizer_scalars"].items():
        opt_state["state"].setdefault(int(index), {}).update(values)
    for group in opt_state["param_groups"]:
        if "betas" in group:
            group["betas"] = tuple(group["betas"])
    return opt_state


def _load_local(trainer: Trainer, folder: Path, opt_state: dict[str, Any]) -> None:
    from safetensors.torch import load_file

    if trainer.is_lora:
        from peft import set_peft_model_state_dict

        adapter = load_file(folder / "adapter_model.safetensors")
        result = set_peft_model_state_dict(trainer.unwrapped, adapter)
        if getattr(result, "unexpected_keys", None):
            raise ConfigError(
                f"checkpoint adapter has unexpected keys: {result.unexpected_keys[:5]}"
            )
    else:
        state = retied(trainer.unwrapped, load_file(folder / "model.safetensors"))
        trainer.unwrapped.load_state_dict(state, strict=True)
    trainer.optimizer.load_state_dict(opt_state)


def _load_sharded(trainer: Trainer, folder: Path, opt_state: dict[str, Any]) -> None:
    """FSDP: every rank reads the full state and keeps its shard (a collective), then
    rank 0 gathers the full weights again for publishing."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    names = _trainable_names(trainer)
    if len(opt_state["state"]) > len(names):
        raise ConfigError(
            f"checkpoint {str(folder)!r} holds optimizer state of "
            f"{len(opt_state['state'])} parameters; this model trains {len(names)}"
        )
    if trainer.is_lora:
        # peft's files name the adapter's weights without the adapter's name.
        adapter = f".{trainer.unwrapped.active_adapter}."
        by_key = {n.replace(adapter, ".", 1): n for n in names}
        saved = load_file(folder / "adapter_model.safetensors")
        unexpected = sorted(set(saved) - set(by_key))
        if unexpected:
            raise ConfigError(f"checkpoint adapter has unexpected keys: {unexpected[:5]}")
        model_state = {by_key[k]: v for k, v in saved.items()}
    else:
        model_state = retied(trainer.model, load_file(folder / "model.safetensors"))
    optim = {
        "state": {names[i]: state for i, state in opt_state["state"].items()},
        "param_groups": [
            {**g, "params": [names[i] for i in g["params"]]} for g in opt_state["param_groups"]
        ],
    }
    options = StateDictOptions(full_state_dict=True, strict=not trainer.is_lora)
    set_state_dict(
        trainer.model,
        _optimizer(trainer),
        model_state_dict=model_state,
        optim_state_dict=optim,
        options=options,
    )
    trainer.gather_full_state()


def save_model(trainer: Trainer, out: Path) -> None:
    """Write the trainer's weights and tokenizer as a model folder ``out``.

    A LoRA run writes the adapter (peft's files); otherwise the full weights (under
    FSDP, the ones gathered at the end of the last step). Written to a temporary
    folder beside ``out`` and renamed into place.
    """
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if trainer.is_lora:
        trainer.save_adapter(tmp)
    else:
        trainer.unwrapped.save_pretrained(tmp, state_dict=trainer.full_state_dict())
    trainer.tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def _tuples(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value
