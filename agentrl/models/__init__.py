"""Models: the locally built tiny model and resolution of a model spec to a loadable path.

A *model spec* is what a user writes in a config or on the command line:

* ``"tiny"``: the tiny Qwen2 model built locally (see :mod:`agentrl.models.tiny`);
* a folder holding a Hugging Face model (``config.json`` and weights);
* a hub name such as ``"Qwen/Qwen2.5-0.5B-Instruct"``, passed through unchanged to
  transformers and vLLM, which download it where a hub is reachable.
"""

from __future__ import annotations

import re
from pathlib import Path

from agentrl.errors import ModelNotFoundError

_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_model(spec: str, *, cache_dir: str | Path | None = None) -> str:
    """Turn a model spec into what transformers and vLLM load.

    Raises:
        ModelNotFoundError: the spec names a local path that is missing or is not a
            model folder.
    """
    if spec == "tiny":
        from agentrl.models.tiny import build_tiny_model

        return str(build_tiny_model(cache_dir=cache_dir))
    path = Path(spec).expanduser()
    looks_local = spec.startswith(("/", ".", "~")) or path.exists() or not _HUB_NAME.match(spec)
    if not looks_local:
        return spec
    if not path.exists():
        raise ModelNotFoundError(
            f"model path {str(path)!r} does not exist; pass a folder with a Hugging Face "
            f"model (config.json and weights), a hub name like 'Qwen/Qwen2.5-0.5B-Instruct', "
            f"or 'tiny' for the locally built test model"
        )
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"{str(path)!r} is not a model folder: it has no config.json; point at the "
            f"folder that save_pretrained wrote"
        )
    return str(path.resolve())


__all__ = ["resolve_model"]
