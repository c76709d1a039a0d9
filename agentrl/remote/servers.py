"""Env servers as a client reaches them: their addresses, their state, their failures in words.

Shared by the pool (:mod:`agentrl.remote.pool`, which routes sessions and watches the
servers' health) and the remote env (:mod:`agentrl.remote.client`, one session per
episode): :class:`Member`, one server's state in the pool; :func:`http_url`;
:func:`describe_error`; the HTTP client both open sessions with; and
:func:`check_servers`, which asks the servers of a config what they serve before
anything starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiohttp

from agentrl.config import EnvConfig
from agentrl.errors import ConfigError
from agentrl.remote import protocol as P
from agentrl.serving import Member as ServerMember

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 5.0
MAX_MESSAGE_BYTES = 100 * 2**20


def http_url(url: str) -> str:
    """The HTTP base URL of a server given as http(s):// or ws(s)://."""
    url = url.rstrip("/")
    if url.startswith("ws://"):
        return "http://" + url[5:]
    if url.startswith("wss://"):
        return "https://" + url[6:]
    return url


@dataclasses.dataclass(eq=False)
class Member(ServerMember):
    """One env server of a pool: its state (up, load: sessions open and being opened,
    backoff) and what it serves."""

    capacity: int | None = None
    """Its session limit: from ``GET /agentrl``, or learnt from a refusal; None: unknown."""
    agentrl: bool = False
    """It answered ``GET /agentrl`` (an agentrl server: snapshots, set_state)."""
    env_id: str = ""
    action_field: str = P.ACTION_FIELD
    mcp: bool = True
    """Its envs may have MCP tools (False once it said it has no MCP)."""
    known: bool = False
    """Its routes have been read (the first time it answered)."""
    sessions: int = 0
    lost: int = 0
    """Sessions that failed with it (it died, hung, dropped them)."""


def describe_error(e: BaseException) -> str:
    """A short account of a connection error (refused, reset, timed out)."""
    if isinstance(e, TimeoutError):
        return "timed out"
    if isinstance(e, aiohttp.WSServerHandshakeError):
        return f"the WebSocket handshake failed (HTTP {e.status})"
    cause = getattr(e, "os_error", None) or e
    text = str(cause) or type(cause).__name__
    return f"{type(cause).__name__}: {text}"[:300]


@contextlib.contextmanager
def connection_gone(what: str) -> Iterator[None]:
    """Let pass, with a debug line, the errors of a connection the other side closed or
    that does not answer in time, while ``what`` (closing it: nothing else was left)."""
    try:
        yield
    except (OSError, RuntimeError, TimeoutError, aiohttp.ClientError) as e:
        logger.debug("%s: %s: %s", what, type(e).__name__, e)


def client_session() -> aiohttp.ClientSession:
    """An HTTP client for sessions (each holds its connection, a WebSocket, for an episode)."""
    # limit=0: every session holds a connection (its WebSocket) for its whole episode
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout)


# -- checking the servers of a config (before anything starts) ----------------------------


def check_servers(env: EnvConfig, *, timeout_s: float = PROBE_TIMEOUT_S) -> EnvConfig:
    """Ask the env servers of ``env`` (``url``/``urls``) what they serve.

    Returns ``env`` with ``id`` set from the first server that names its env when it
    was empty. Servers that do not answer are only warned about (they join the rotation
    when they come up), unless none answers.

    Raises:
        ConfigError: no server answers; an agentrl server serves another env than
            ``env.id``; ``env.id`` is empty and no server names its env.
    """
    answers: dict[str, dict[str, Any]] = {}
    silent: list[str] = []
    for url in env.servers:
        try:
            _get_json(url, "/health", timeout_s)
        except (OSError, ValueError) as e:
            silent.append(f"{url}: {e}")
            continue
        answer: dict[str, Any] = {}
        for route in ("/agentrl", "/metadata"):
            try:
                answer[route] = _get_json(url, route, timeout_s)
            except (OSError, ValueError):
                answer[route] = None
        answers[url] = answer
    if not answers:
        raise ConfigError(
            "no env server answers (env.url/env.urls): "
            + "; ".join(silent)
            + ". Start one with: agentrl serve-env ENV_ID --port PORT"
        )
    for problem in silent:
        logger.warning("env server %s does not answer yet; it joins when it does", problem)
    env_id = env.id
    for url, answer in answers.items():
        info = answer["/agentrl"] if isinstance(answer["/agentrl"], dict) else {}
        metadata = answer["/metadata"] if isinstance(answer["/metadata"], dict) else {}
        served = str(info.get("env_id") or "")
        if env_id and served and served != env_id:
            raise ConfigError(f"env server {url} serves {served}, not env.id = {env_id!r}")
        if not env_id:
            env_id = served or str(metadata.get("name") or "")
    if not env_id:
        raise ConfigError(
            f"env.id is empty and the env server {next(iter(answers))} does not "
            "name its env (/metadata); set env.id"
        )
    return env if env_id == env.id else dataclasses.replace(env, id=env_id)


def _get_json(url: str, route: str, timeout_s: float) -> Any:
    with urllib.request.urlopen(http_url(url) + route, timeout=timeout_s) as r:
        return json.loads(r.read())
