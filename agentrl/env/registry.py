"""Env ids: registration through Gymnasium's own registry, and the ``agentrl.envs`` plugins.

:func:`register_env` registers an id (Gymnasium's passive checker off: it warns on text
spaces it does not know); :func:`make_env` builds one after loading the plugins, so ids
registered by installed packages exist; :func:`check_env_config` checks ``[env]`` at
start. Everything here is importable from :mod:`agentrl.env`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from agentrl.config import EnvConfig
from agentrl.config.sections import DATASET_ENV_ID
from agentrl.errors import ConfigError


def register_env(
    env_id: str,
    entry_point: str | Callable[..., Any],
    /,
    *,
    max_episode_steps: int | None = None,
    **kwargs: Any,
) -> None:
    """Register an env with Gymnasium so ``gymnasium.make(env_id)`` builds it.

    Re-registering the same id with the same entry point is a no-op (module reloads).
    Gymnasium's passive checker is off: it warns on text spaces it does not know.
    ``kwargs`` go to the env's constructor.
    """
    existing = gym.registry.get(env_id)
    if existing is not None and existing.entry_point == entry_point and existing.kwargs == kwargs:
        return
    gym.register(
        id=env_id,
        entry_point=entry_point,
        max_episode_steps=max_episode_steps,
        disable_env_checker=True,
        order_enforce=True,
        kwargs=kwargs,
    )


ENV_ENTRY_POINTS = "agentrl.envs"
"""Packages name, in this entry-point group, a module that registers their envs on
import (agentrl's own ``envs`` folder is one); :func:`load_env_plugins` imports them."""


def load_env_plugins() -> None:
    """Import every module of the ``agentrl.envs`` entry-point group (once each).

    That is how the library learns env ids without importing any env package itself:
    a package lists ``[project.entry-points."agentrl.envs"] name = "module"``. It also
    registers ``agentrl/Dataset-v0`` (:class:`agentrl.dataset_env.DatasetEnv`, by name).
    One scan at a time: the env threads of a run's first episodes all reach
    :func:`make_env` at once, and each would otherwise scan (76 scans at the start of a
    1024-episode wave, measured) or go on while another thread is still importing the
    plugin that registers its id.
    """
    import importlib.metadata

    global _plugins_scanned
    with _plugins_lock:
        register_env(DATASET_ENV_ID, "agentrl.dataset_env:DatasetEnv")
        for entry in importlib.metadata.entry_points(group=ENV_ENTRY_POINTS):
            if entry.value not in _loaded_plugins:
                _loaded_plugins.add(entry.value)
                entry.load()
        _plugins_scanned = True


_plugins_lock = threading.RLock()
_loaded_plugins: set[str] = set()
_plugins_scanned = False
"""Whether :func:`load_env_plugins` ran in this process (:func:`make_env` scans once)."""


def import_env_modules(imports: Sequence[str], *, key: str = "env.imports") -> None:
    """Import modules or run .py files (where users register their envs).

    Raises:
        ConfigError: naming ``key`` and the module or file that could not be imported.
    """
    import importlib
    import runpy
    from pathlib import Path

    for target in imports:
        try:
            if target.endswith(".py"):
                if not Path(target).is_file():
                    raise ConfigError(f"{key}: file {target!r} does not exist")
                runpy.run_path(target, run_name="__agentrl_env__")
            else:
                importlib.import_module(target)
        except ModuleNotFoundError as e:
            raise ConfigError(f"{key}: cannot import {target!r}: {e}") from None


def check_env_config(env: EnvConfig) -> None:
    """Check that ``env.id`` is registered (after ``env.imports``) and takes ``env.kwargs``.

    Envs on env servers (``env.url``/``env.urls``) are not built here:
    :func:`agentrl.remote.check_servers` asks the servers.

    Raises:
        ConfigError: naming the key, the value, and the registered ids.
    """
    load_env_plugins()
    import_env_modules(env.imports)
    if env.remote:  # built on its env servers; agentrl.remote checks them
        return
    if env.id not in gym.registry:
        known = sorted(k for k in gym.registry if k.startswith("agentrl/"))
        raise ConfigError(
            f"env.id = {env.id!r} is not registered; shipped envs: {known}. For your "
            f"own env, list the module or file that registers it in env.imports"
        )
    try:
        gym.make(env.id, **env.kwargs).close()
    except TypeError as e:
        raise ConfigError(f"env.kwargs = {env.kwargs!r} do not fit {env.id}: {e}") from None


def make_env(env_id: str, **kwargs: Any) -> gym.Env[Any, Any]:
    """``gymnasium.make`` after loading the ``agentrl.envs`` plugins, so their ids exist.

    The plugins are scanned once per process, and again only for an id not registered
    yet (a package installed since): the scan reads every installed distribution's
    metadata (about 5 ms with a few hundred installed), which once per episode was most
    of the rollout loop's CPU.
    """
    if not _plugins_scanned or env_id not in gym.registry:
        with _plugins_lock:  # another thread's scan may have registered it meanwhile
            if not _plugins_scanned or env_id not in gym.registry:
                load_env_plugins()
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.Error as e:
        known = sorted(i for i in gym.registry if i.startswith("agentrl/"))
        raise gym.error.Error(f"{e}; agentrl envs registered: {known}") from e
