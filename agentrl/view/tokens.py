"""The text of each token id of a run, for showing tokens one by one.

A run's tokenizer is found without the network: the final model a train run saved
(``RUN_DIR/model``), else the configured ``model.path`` when it is ``tiny`` (built
locally) or a local folder, else a hub name already in the local cache. When none can
be loaded the page shows ids (``⟨123⟩``) instead of text. Decoding is per unique id,
so a 32k-token episode costs one batch decode of its distinct ids.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class TokenText:
    """Maps token ids to their text for one run (the tokenizer loads on first use)."""

    def __init__(self, run_dir: Path, model_path: str | None) -> None:
        self.run_dir = run_dir
        self.model_path = model_path
        self._tokenizer: Any = None
        self._tried = False
        self._lock = threading.Lock()
        self._cache: dict[int, str] = {}

    def _load(self) -> Any:
        with self._lock:
            if not self._tried:
                self._tried = True
                self._tokenizer = _load_tokenizer(self.run_dir, self.model_path)
            return self._tokenizer

    def texts(self, ids: Iterable[int]) -> dict[int, str]:
        """``{id: text}`` for every distinct id in ``ids``."""
        wanted = sorted(set(ids))
        missing = [i for i in wanted if i not in self._cache]
        if missing:
            tokenizer = self._load()
            if tokenizer is None:
                self._cache.update({i: f"⟨{i}⟩" for i in missing})
            else:
                pieces = tokenizer.batch_decode([[i] for i in missing], skip_special_tokens=False)
                self._cache.update(zip(missing, pieces, strict=True))
        return {i: self._cache[i] for i in wanted}


class _Fast:
    """A ``tokenizer.json`` loaded with the ``tokenizers`` library (what a fast
    transformers tokenizer wraps), answering ``batch_decode`` as transformers does."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(path))

    def batch_decode(self, ids: list[list[int]], skip_special_tokens: bool = False) -> list[str]:
        return list(self._tokenizer.decode_batch(ids, skip_special_tokens=skip_special_tokens))


def _load_tokenizer(run_dir: Path, model_path: str | None) -> Any:
    final = run_dir / "model"
    candidates: list[tuple[str, dict[str, Any]]] = []
    if (final / "tokenizer_config.json").exists():
        candidates.append((str(final), {}))
    if model_path == "tiny":
        try:
            from agentrl.models import resolve_model

            candidates.append((resolve_model("tiny"), {}))
        except Exception as e:  # the tiny model could not be built here: show ids
            logger.warning("could not build the tiny model's tokenizer: %s", e)
    elif model_path:
        local = Path(model_path).expanduser()
        candidates.append(
            (str(local), {}) if local.exists() else (model_path, {"local_files_only": True})
        )
    for name, kwargs in candidates:
        fast = Path(name) / "tokenizer.json"
        try:
            if fast.is_file():  # the Rust tokenizer alone: no transformers import (seconds)
                return _Fast(fast)
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(name, **kwargs)
        except Exception as e:  # any failure means: show ids, and say why in the log
            logger.warning("no tokenizer from %s (%s); tokens are shown as ids", name, e)
    return None
