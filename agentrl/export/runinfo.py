"""What an export says about the run itself: its name, model, config, agentrl version;
and the check that the optional package a format needs is installed.

In: an open :class:`~agentrl.store.EpisodeStore`. Out: :class:`RunInfo`.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
from typing import Any

from agentrl.errors import ConfigError
from agentrl.store import EpisodeStore

EXTRA_PACKAGES = {"atif": "atif", "inspect_ai": "inspect-ai"}
"""Import name → the distribution ``pip install 'agentrl[export]'`` brings."""


@dataclasses.dataclass(frozen=True, slots=True)
class RunInfo:
    """The run an export comes from."""

    name: str
    """``run.name`` of its config, else the run directory's name."""
    model: str | None
    """``model.path`` of its config."""
    config: dict[str, Any]
    """The config of its first start, as recorded in the store (empty if none)."""
    agentrl_version: str

    @classmethod
    def of(cls, store: EpisodeStore) -> RunInfo:
        config = store.first_config() or {}
        name = (config.get("run") or {}).get("name") or store.path.parent.name
        model = (config.get("model") or {}).get("path")
        return cls(str(name), None if model is None else str(model), config, _version())


def _version() -> str:
    try:
        return importlib.metadata.version("agentrl")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def require(module: str) -> None:
    """Refuse, in one line, a format whose package is not installed."""
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"this format needs the {EXTRA_PACKAGES.get(module, module)!r} package, which is "
            f"not installed; install it with: pip install 'agentrl[export]'"
        )
