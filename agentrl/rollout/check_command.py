"""The ``agentrl check-env`` command that shows why an env's episode does not replay.

The runner replays the first episodes of each env from their seed
(:meth:`~agentrl.rollout.envside.EnvCalls._check_replayable`); when one differs, its
warning names the command to run: the env id, its ``--kwargs``, the ``--import`` that
registers a user's env, and the episode's own moves as ``--example-action`` (the checker
explores from them, so a move in a syntax its explorer never writes, such as
``reveal 3 4``, is made there too). In: the task and its env log. Out: one shell line.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Any

import gymnasium as gym

from agentrl.env import ENV_ENTRY_POINTS
from agentrl.types import Task

EXAMPLES = 3
"""The episode's moves given as examples: its last distinct ones up to the difference."""
LONGEST_EXAMPLE = 300


def check_env_command(task: Task, env_log: Sequence[dict[str, Any]], upto: int) -> str:
    """``agentrl check-env`` for ``task``'s env, with the moves of ``env_log[1:upto + 1]``."""
    parts = ["agentrl", "check-env", task.env_id]
    source = _registered_in(task.env_id)
    if source is not None:
        parts += ["--import", source]
    if task.env_kwargs:
        parts += ["--kwargs", json.dumps(task.env_kwargs)]
    actions = [e["action"] for e in env_log[1 : upto + 1] if isinstance(e.get("action"), str)]
    kept = [a for a in dict.fromkeys(reversed(actions)) if len(a) <= LONGEST_EXAMPLE]
    for action in reversed(kept[:EXAMPLES]):
        parts += ["--example-action", action]
    return shlex.join(parts)


def _registered_in(env_id: str) -> str | None:
    """The module or file to ``--import`` for ``env_id``; None for envs every command
    finds itself (agentrl's, Gymnasium's, installed plugins') and ids it cannot place."""
    spec = gym.registry.get(env_id)
    if spec is None:
        return None
    entry = spec.entry_point
    if isinstance(entry, str):
        module = entry.partition(":")[0]
    else:
        module = getattr(entry, "__module__", None) or ""
        if module.startswith("__"):  # run from a file (--import path.py): name the file
            return _file_of(entry)
    loaded_anyway = ("agentrl", "gymnasium", *_plugin_modules())  # found without --import
    if not module or any(module == m or module.startswith(m + ".") for m in loaded_anyway):
        return None
    return module


def _plugin_modules() -> list[str]:
    """The modules of the ``agentrl.envs`` entry points (every command imports them)."""
    import importlib.metadata

    return [e.value for e in importlib.metadata.entry_points(group=ENV_ENTRY_POINTS)]


def _file_of(entry: Any) -> str | None:
    """The file a class or function run from a file was defined in."""
    code = getattr(entry, "__code__", None)
    if code is None:  # a class: any of its own functions knows the file
        functions = (getattr(v, "__code__", None) for v in vars(entry).values())
        code = next((c for c in functions if c is not None), None)
    return None if code is None else code.co_filename
