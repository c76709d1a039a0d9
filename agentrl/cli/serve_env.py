"""``agentrl serve-env ENV_ID --port P``: a registered env over the OpenEnv protocol."""

from __future__ import annotations

import argparse
import asyncio


def _serve_env(args: argparse.Namespace, extra: list[str]) -> int:
    from agentrl.env import import_env_modules, load_env_plugins
    from agentrl.errors import ConfigError
    from agentrl.remote.server import EnvServer, serve_env

    load_env_plugins()
    import_env_modules(args.imports, key="--import")
    if not isinstance(args.kwargs, dict):
        raise ConfigError(f"--kwargs must be a JSON object, got {args.kwargs!r}")
    server = EnvServer(
        args.env_id,
        kwargs=args.kwargs,
        max_sessions=args.max_sessions,
        idle_timeout_s=args.idle_timeout_s,
        env_timeout_s=args.env_timeout_s,
        tool_timeout_s=args.tool_timeout_s,
    )
    server.probe()  # a bad id or kwargs fail here, before anything listens
    url = f"http://{args.host}:{args.port}"

    def ready() -> None:
        state = "with get_state/set_state" if server.supports_state else "no get_state"
        print(
            f"agentrl serve-env: {args.env_id} ({state}) on {url}, up to "
            f'{args.max_sessions} sessions; train on it with [env] url = "{url}"',
            flush=True,
        )

    try:
        asyncio.run(serve_env(server, args.host, args.port, ready))
    except OSError as e:
        raise ConfigError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from e
    return 0
