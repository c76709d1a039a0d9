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
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{trainer.step:06d}"
    final = root / name
    tmp = root / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model = trainer.unwrapped
    if trainer.is_lora:
        model.save_pretrained(tmp)
    else:
        state = {k: v.contiguous() for k, v in trainer.full_state_dict().items()}
        save_file(state, tmp / "model.safetensors")
    opt = trainer.optimizer.state_dict()
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
        "python_rng": _jsonable(random.getstate()),
        "numpy_rng": [np_state[0], np_state[1].tolist(), *map(_plain, np_state[2:])],
        "config": _jsonable(dataclasses.asdict(trainer.config)),
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


def latest_checkpoint(root: Path) -> Path | None:
    pointer = Path(root) / LATEST
    if not pointer.exists():
        return None
    folder = Path(root) / pointer.read_text().strip()
    return folder if folder.is_dir() else None


def load_checkpoint(trainer: Trainer, folder: Path) -> None:
    """Restore weights (or adapter), optimizer, step, version and RNG states."""
    from safetensors.torch import load_file

    folder = Path(folder)
    meta_path = folder / "trainer.json"
    if not meta_path.exists():
        raise ConfigError(f"{str(folder)!r} is not a trainer checkpoint (no trainer.json)")
    meta = json.loads(meta_path.read_text())
    if trainer.is_lora:
        from peft import set_peft_model_state_dict

        adapter = load_file(folder / "adapter_model.safetensors")
        result = set_peft_model_state_dict(trainer.unwrapped, adapter)
        if getattr(result, "unexpected_keys", None):
            raise ConfigError(
                f"checkpoint adapter has unexpected keys: {result.unexpected_keys[:5]}"
            )
    else:
        state = load_file(folder / "model.safetensors")
        trainer.unwrapped.load_state_dict(state, strict=True)
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
    trainer.optimizer.load_state_dict(opt_state)
    torch.set_rng_state(load_file(folder / "rng.safetensors")["torch"])
    random.setstate(_tuples(meta["python_rng"]))
    kind, keys, *rest = meta["numpy_rng"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    trainer.step = int(meta["step"])
    trainer.set_version(int(meta["version"]))


def save_model(trainer: Trainer, out: Path) -> None:
    """Write the trainer's weights and tokenizer as a model folder ``out``.

    A LoRA run writes the adapter (peft's files); otherwise the full weights (under
    FSDP, the ones gathered at the end of the last step). Written to a temporary
    folder beside ``out`` and renamed into place.
    """
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if trainer.is_lora:
        trainer.unwrapped.save_pretrained(tmp)
    else:
        trainer.unwrapped.save_pretrained(tmp, state_dict=trainer.full_state_dict())
    trainer.tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return _plain(value)


def _tuples(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value
