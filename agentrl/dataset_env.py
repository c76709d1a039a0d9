"""Tasks from a dataset: :class:`DatasetEnv`, one row of a Hugging Face ``datasets`` split
per episode, scored by a verifier.

Config (``[env]``)::

    dataset = "data/problems.jsonl"     # a JSONL/JSON, Parquet or CSV file, a folder of
                                        # them (train.jsonl, test.jsonl), or a hub name
    kwargs = {verifier = "my_rewards:exact_match", split = "train",
              prompt_column = "question", tools = ["tools.calculator:calculator"]}

``env.dataset`` sets ``env.id`` to ``agentrl/Dataset-v0`` (registered by
:func:`agentrl.env.load_env_plugins`) and passes the dataset to it; the rest of the
options are its ``env.kwargs``. Seeds map to rows deterministically: seed s is row
``s % len(split)`` (so ``agentrl eval`` on ``split = "test"`` scores held-out rows).

The verifier, named ``"module:function"`` or ``"file.py:function"``, is either

* plain: ``f(completion, **columns) -> float | bool``, given the columns its
  parameters name (every column if it takes ``**kwargs``), or
* a TRL reward function: ``f(prompts, completions, **columns) -> list[float]`` (a
  ``completions`` parameter says which), called with one-element lists.

Bad data is found when the env is built (``agentrl check-env``, and before vLLM starts
in ``train``, ``rollout`` and ``eval``): a missing file, an unknown split, an empty
split, a missing prompt column, a verifier that cannot be imported or that raises on
the first row. A verifier that raises later fails only that episode.

This module owns loading, the seed-to-row map and the call into the verifier; it never
calls a model. In: the options above. Out: a Gymnasium :class:`~agentrl.env.TextEnv`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentrl.env import Message, MessagesSpace, TextEnv
from agentrl.errors import ConfigError

_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


@dataclasses.dataclass(frozen=True, slots=True)
class Verifier:
    """A user's verifier or TRL reward function, called one completion at a time."""

    name: str
    fn: Callable[..., Any]
    trl: bool
    """Takes ``prompts`` and ``completions`` lists (TRL's reward-function signature)."""

    def __call__(self, prompt: Any, completion: str, row: dict[str, Any]) -> float:
        params = inspect.signature(self.fn).parameters
        takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        if self.trl:
            columns = {k: [v] for k, v in row.items() if takes_all or k in params}
            for taken in ("prompts", "completions"):
                columns.pop(taken, None)
            out = self.fn(prompts=[prompt], completions=[completion], **columns)
            value = out[0] if isinstance(out, Sequence) else out
        else:
            columns = {k: v for k, v in row.items() if takes_all or k in params}
            columns.pop("completion", None)
            value = self.fn(completion, **columns)
        return float(value)


def load_verifier(spec: str) -> Verifier:
    """The function ``spec`` names: ``"module:function"`` or ``"path/file.py:function"``.

    Raises:
        ConfigError: naming ``env.kwargs.verifier`` and what could not be found.
    """
    import runpy

    where, sep, attr = spec.rpartition(":")
    if not sep or not where or not attr:
        raise ConfigError(
            f"env.kwargs.verifier = {spec!r}; give 'module:function' or 'file.py:function'"
        )
    try:
        if where.endswith(".py"):
            namespace = runpy.run_path(where, run_name="__agentrl_verifier__")
        else:
            namespace = vars(importlib.import_module(where))
    except (ImportError, OSError) as e:
        raise ConfigError(f"env.kwargs.verifier = {spec!r}: cannot import {where!r}: {e}") from None
    fn = namespace.get(attr)
    if not callable(fn):
        raise ConfigError(f"env.kwargs.verifier = {spec!r}: {where!r} has no function {attr!r}")
    return Verifier(spec, fn, "completions" in inspect.signature(fn).parameters)


@functools.lru_cache(maxsize=16)
def load_rows(dataset: str, split: str, mtime: float) -> tuple[dict[str, Any], ...]:
    """The rows of ``split`` of ``dataset`` (cached per file modification time).

    Raises:
        ConfigError: the dataset or the split cannot be read, or the split is empty.
    """
    _refuse_missing_local(dataset)  # before the hub is tried (30 s, then a hub error)
    import datasets

    datasets.disable_progress_bars()
    path = Path(dataset)
    try:
        if path.is_file():
            if path.stat().st_size == 0:
                raise ConfigError(
                    f"env.kwargs.split = {split!r} of {dataset!r} is empty (an empty file)"
                )
            builder = _BUILDERS.get(path.suffix.lower())
            if builder is None:
                raise ConfigError(
                    f"env.dataset = {dataset!r}: a {path.suffix or 'plain'} file; "
                    f"give {', '.join(_BUILDERS)}"
                )
            data = datasets.load_dataset(builder, data_files={"train": str(path)}, split=split)
        else:
            data = datasets.load_dataset(dataset, split=split)
    except ConfigError:
        raise
    except (ValueError, KeyError) as e:
        raise ConfigError(f"env.kwargs.split = {split!r} of {dataset!r}: {e}") from None
    except FileNotFoundError as e:
        raise ConfigError(
            f"env.dataset = {dataset!r}: no such file, folder or dataset ({e})"
        ) from None
    except Exception as e:  # datasets' parse errors have no common base class
        raise ConfigError(
            f"env.dataset = {dataset!r} cannot be read: {type(e).__name__}: {e}"
        ) from None
    if len(data) == 0:
        raise ConfigError(f"env.kwargs.split = {split!r} of {dataset!r} is empty")
    return tuple(data)


def _looks_local(dataset: str) -> bool:
    """Whether ``dataset`` names a local file or folder rather than a hub dataset: a data
    file's suffix, a path that starts at ``/``, ``.`` or ``~``, a backslash, more than
    one ``/`` (a hub name is ``name`` or ``owner/name``), or a first part that is a local
    folder (``data/nope`` where ``data/`` exists)."""
    return (
        Path(dataset).suffix.lower() in {*_BUILDERS, ".txt", ".tsv", ".arrow"}
        or dataset.startswith(("/", ".", "~"))
        or "\\" in dataset
        or dataset.count("/") > 1
        or ("/" in dataset and Path(dataset.split("/", 1)[0]).is_dir())
    )


def _refuse_missing_local(dataset: str) -> None:
    path = Path(dataset).expanduser()
    if _looks_local(dataset) and not path.exists():
        folder = path.absolute().parent
        seen = "" if folder.is_dir() else " (that folder does not exist either)"
        raise ConfigError(
            f"env.dataset = {dataset!r}: no such file or folder; looked in {str(folder)!r}"
            f"{seen}. A path is relative to the folder the command runs in; a hub dataset "
            f"is named 'name' or 'owner/name'"
        )


class DatasetEnv(TextEnv):
    """One dataset row per episode: its prompt, the model's answer, the verifier's score.

    Args:
        dataset: a JSONL/JSON, Parquet or CSV file, a folder of them, or a hub name.
        verifier: ``"module:function"`` or ``"file.py:function"`` (see the module doc).
        split: the split's name; datasets' slices work (``"train[:90%]"``). A single
            file is the split ``train``.
        prompt_column: the column holding the prompt (text or a list of chat messages).
        system_prompt: shown before the prompt.
        tools: ``"module:function"`` names of the tools the agent may call.
    """

    def __init__(
        self,
        dataset: str,
        *,
        verifier: str,
        split: str = "train",
        prompt_column: str = "prompt",
        system_prompt: str | None = None,
        tools: Sequence[str] = (),
    ) -> None:
        mtime = os.path.getmtime(dataset) if os.path.exists(dataset) else 0.0
        self.rows, self.verifier = _source(dataset, split, mtime, prompt_column, verifier)
        self.prompt_column = prompt_column
        if isinstance(self.rows[0][prompt_column], list):  # chat messages, not text
            self.observation_space = MessagesSpace()
        self.system_prompt = system_prompt  # type: ignore[misc]  # per instance
        self.tools = tuple(_tool(t) for t in tools)  # type: ignore[misc]
        self.index = 0

    @property
    def row(self) -> dict[str, Any]:
        return self.rows[self.index]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str | list[Message], dict[str, Any]]:
        super().reset(seed=seed)
        self.index = (seed or 0) % len(self.rows)
        return self.row[self.prompt_column], {"row": self.index}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        prompt = self.row[self.prompt_column]
        try:
            reward = self.verifier(prompt, action, dict(self.row))
        except Exception as e:
            raise RuntimeError(
                f"verifier {self.verifier.name} raised on row {self.index}: {type(e).__name__}: {e}"
            ) from e
        return "", reward, True, False, {"row": self.index}

    def get_state(self) -> dict[str, Any]:
        return {"row": self.index}

    def set_state(self, state: dict[str, Any]) -> None:
        self.index = int(state["row"])


@functools.lru_cache(maxsize=16)
def _source(
    dataset: str, split: str, mtime: float, prompt_column: str, verifier: str
) -> tuple[tuple[dict[str, Any], ...], Verifier]:
    """The rows and the verifier, checked once per process (each episode builds an env)."""
    rows = load_rows(dataset, split, mtime)
    if prompt_column not in rows[0]:
        raise ConfigError(
            f"env.kwargs.prompt_column = {prompt_column!r} is not a column of {dataset!r} "
            f"({split}); columns: {sorted(rows[0])}"
        )
    checked = load_verifier(verifier)
    _probe(checked, dict(rows[0]), prompt_column)
    return rows, checked


def _tool(spec: str) -> Callable[..., Any]:
    module, _, attr = spec.rpartition(":")
    try:
        return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"env.kwargs.tools: cannot import {spec!r}: {e}") from None


def _probe(verifier: Verifier, row: dict[str, Any], prompt_column: str) -> None:
    """Call the verifier on the first row with an empty answer: one that raises or
    returns no number fails here, before any episode runs."""
    try:
        verifier(row[prompt_column], "", row)
    except Exception as e:
        raise ConfigError(
            f"env.kwargs.verifier = {verifier.name!r} failed on row 0 with an "
            f"empty answer: {type(e).__name__}: {e}; a verifier must return a "
            f"number (or bool) for any text"
        ) from e
