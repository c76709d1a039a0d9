"""OpenEnv's own example env (the ``openenv init`` template) served by OpenEnv's own server.

``python tests/remote/openenv_echo_server.py ENV_DIR --port P`` serves the env that
``openenv init echo_env -o DIR`` rendered into ``ENV_DIR`` (its ``models.py`` and
``server/echo_env_environment.py``), with OpenEnv's ``create_app`` under uvicorn on
127.0.0.1. The remote-env tests drive it with agentrl's client: a peer server that
agentrl did not write.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("env_dir", help="the directory `openenv init echo_env` rendered")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-sessions", type=int, default=8)
    args = parser.parse_args()

    import uvicorn
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation

    sys.path.insert(0, args.env_dir)  # the template imports `models` and `server.*` from there
    models = importlib.import_module("models")
    environment = importlib.import_module("server.echo_env_environment")
    app = create_app(
        _subclass(environment, Environment),
        _subclass(models, Action),
        _subclass(models, Observation),
        env_name="echo_env",
        max_concurrent_envs=args.max_sessions,
    )
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


def _subclass(module: ModuleType, base: type) -> type:
    """The one class of ``module`` derived from ``base`` (the template names them after
    the env: ``EchoAction``, ``EchoEnvironment``, ...)."""
    found = [
        v
        for v in vars(module).values()
        if isinstance(v, type)
        and issubclass(v, base)
        and v is not base
        and v.__module__ == module.__name__
    ]
    if len(found) != 1:
        raise SystemExit(f"{module.__file__}: expected one {base.__name__} class, found {found}")
    return found[0]


if __name__ == "__main__":
    main()
