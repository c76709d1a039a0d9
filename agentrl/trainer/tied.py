"""Tied weights (input and output embeddings of Qwen2.5-0.5B and 1.5B) in weight files.

safetensors refuses to write tensors that share memory, so a state dict is written
with one name per tensor (:func:`untied`), and filled in again from the model's own
ties before a strict load (:func:`retied`). Loaders of a model whose config says
``tie_word_embeddings`` tie the output embeddings to the input ones themselves (vLLM
skips ``lm_head.weight`` then; transformers re-ties on load).
"""

from __future__ import annotations

from typing import Any


def untied(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with one name per tensor: of names that share one tensor the first is
    kept (the input embeddings come before the LM head)."""
    seen: set[tuple[int, int, tuple[int, ...], Any]] = set()
    out = {}
    for name, tensor in state.items():
        key = (
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tensor.dtype,
        )
        if tensor.numel() and key in seen:
            continue
        seen.add(key)
        out[name] = tensor
    return out


def tie_groups(model: Any) -> list[list[str]]:
    """The names of each parameter the model holds under several names."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def retied(model: Any, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (written by :func:`untied`) with the names it left out for ``model``'s
    tied parameters, each given its group's tensor."""
    out = dict(state)
    for group in tie_groups(model):
        present = [name for name in group if name in out]
        for name in group:
            if present and name not in out:
                out[name] = out[present[0]]
    return out
