"""Models: the locally built tiny model and resolution of a model spec to a loadable path.

A *model spec* is what a user writes in a config or on the command line:

* ``"tiny"``: the tiny Qwen2 model built locally (see :mod:`agentrl.models.tiny`);
* a folder holding a Hugging Face model (``config.json`` and weights);
* a hub name such as ``"Qwen/Qwen2.5-0.5B-Instruct"``, passed through unchanged to
  transformers and vLLM, which download it where a hub is reachable.
"""

from __future__ import annotations

import json
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
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ModelNotFoundError(
            f"{str(path / 'config.json')!r} is not a readable model config ({e}); point at "
            f"the folder that save_pretrained wrote"
        ) from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise ModelNotFoundError(
            f"{str(path / 'config.json')!r} has no model_type, so it is not a transformers "
            f"model config; point at the folder that save_pretrained wrote"
        )
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ModelNotFoundError(
            f"{str(path)!r} has a config.json but no weights (*.safetensors or *.bin); "
            f"save the model there with save_pretrained"
        )
    return str(path.resolve())


def check_chat_template(model_path: str) -> None:
    """Refuse a tokenizer without a chat template (agentrl renders every turn with it).

    Raises:
        ModelNotFoundError: naming the folder and how to add a template.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if not getattr(tokenizer, "chat_template", None):
        raise ModelNotFoundError(
            f"the tokenizer in {model_path!r} has no chat template, and agentrl renders "
            f"every conversation with it; use an instruct/chat model, or set "
            f"tokenizer.chat_template and save_pretrained it into that folder"
        )


__all__ = ["check_chat_template", "resolve_model"]
