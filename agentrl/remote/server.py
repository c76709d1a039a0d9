"""``agentrl serve-env``: any registered text env served over the OpenEnv protocol.

:class:`EnvServer` is an aiohttp application with OpenEnv's routes (see
:mod:`agentrl.remote.protocol`). Each WebSocket connection to ``/ws`` is one session
with an env instance of its own, driven by :class:`~agentrl.env.EnvHandle` exactly as
the rollout engine drives a local env: a sync env in a worker thread of its own, an
async env on the server's loop, the registered ``max_episode_steps`` applied. Sessions
run concurrently (up to ``max_sessions``); each answers its messages in order.

Limits: every env call (make, reset, step, set_state) has a deadline
(``env_timeout_s``; past it the session answers an error and is closed, since its env
is stuck), every tool call one of its own (``tool_timeout_s``), and a session idle
for ``idle_timeout_s`` is closed (a trainer that died leaves no env behind).

Why not openenv-core's own ``HTTPEnvServer``: its WebSocket loop is a closure with no
way to add the messages resume and forks need (``set_state``) or to run an env's own
tools (it expects a FastMCP server object), and it would make fastapi and uvicorn
requirements of ``agentrl serve-env``. The wire format is the same; the tests drive
this server with openenv-core's own clients.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import WSMsgType, web

from agentrl.env import make_env, supports_state
from agentrl.errors import ConfigError
from agentrl.remote import protocol as P
from agentrl.remote.servers import connection_gone
from agentrl.remote.sessions import EnvCallError, Session, SessionMessages, reset_args
from agentrl.runtime.background import BackgroundTasks
from agentrl.tools import ToolSet

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 100 * 2**20
"""Largest message either side takes (OpenEnv's client default)."""

ACTION_SCHEMA = {
    "title": "TextAction",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "message": {"type": "string", "title": "Message", "description": "The model's turn."},
        "metadata": {"type": "object", "title": "Metadata", "additionalProperties": True},
    },
    "required": ["message"],
}
OBSERVATION_SCHEMA = {
    "title": "TextObservation",
    "type": "object",
    "properties": {
        "text": {
            "anyOf": [{"type": "string"}, {"type": "null"}],
            "description": "The observation, when the env returns a string.",
        },
        "messages": {
            "anyOf": [{"type": "array", "items": {"type": "object"}}, {"type": "null"}],
            "description": "The observation, when the env returns chat messages.",
        },
        "truncated": {"type": "boolean", "description": "A limit ended the episode."},
        "info": {"type": "object", "description": "The env's info dict (JSON values)."},
        "env_state": {
            "anyOf": [{"type": "object"}, {"type": "null"}],
            "description": "The env's get_state() after this call, if it has one.",
        },
        "system_prompt": {
            "anyOf": [{"type": "string"}, {"type": "null"}],
            "description": "Reset only: the env's system prompt.",
        },
        "tool_specs": {
            "type": "array",
            "items": {"type": "object"},
            "description": "Reset only: the env's tools, as MCP tool specs.",
        },
    },
}
STATE_SCHEMA = {
    "title": "TextEnvState",
    "type": "object",
    "additionalProperties": True,
    "properties": {
        "episode_id": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "step_count": {"type": "integer", "minimum": 0},
        "env_id": {"type": "string"},
        "env_state": {"anyOf": [{"type": "object"}, {"type": "null"}]},
    },
}


class EnvServer(SessionMessages):
    """A registered text env served over the OpenEnv protocol (see the module docstring).

    Args:
        env_id: a registered env id (register it first: ``env.imports``/``--import``).
        kwargs: keyword arguments for each session's env.
        max_sessions: sessions at once; one more is refused with ``CAPACITY_REACHED``.
        idle_timeout_s: a session with no message for this long is closed.
        env_timeout_s: deadline for one make, reset, step or set_state.
        tool_timeout_s: deadline for one tool call.
        make: builds an env (default: Gymnasium's registry).
    """

    def __init__(
        self,
        env_id: str,
        *,
        kwargs: Mapping[str, Any] | None = None,
        max_sessions: int = 512,
        idle_timeout_s: float = 600.0,
        env_timeout_s: float = 300.0,
        tool_timeout_s: float = 300.0,
        make: Callable[..., Any] = make_env,
    ) -> None:
        if max_sessions < 1:
            raise ConfigError(f"--max-sessions = {max_sessions}; it must be at least 1")
        for name, value in (
            ("--idle-timeout-s", idle_timeout_s),
            ("--env-timeout-s", env_timeout_s),
            ("--tool-timeout-s", tool_timeout_s),
        ):
            if not value > 0:
                raise ConfigError(f"{name} = {value}; it must be > 0")
        self.env_id = env_id
        self.kwargs = dict(kwargs or {})
        self.max_sessions = max_sessions
        self.idle_timeout_s = idle_timeout_s
        self.env_timeout_s = env_timeout_s
        self.tool_timeout_s = tool_timeout_s
        self.make = make
        self.sessions: dict[str, Session] = {}
        self.counters: Counter[str] = Counter()
        self.supports_state = False
        self._background = BackgroundTasks("agentrl serve-env's idle-session reaper")
        """The reaper; if it crashes, /health says so (503) and stopping raises it."""
        self._runner: web.AppRunner | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def probe(self) -> None:
        """Build the env once (fail fast on a bad id or kwargs); learn if it has state.

        Raises:
            ConfigError: naming the id and what went wrong.
        """
        try:
            env = self.make(self.env_id, **self.kwargs)
        except Exception as e:
            raise ConfigError(
                f"cannot make {self.env_id!r} with kwargs {self.kwargs}: {type(e).__name__}: {e}"
            ) from e
        try:
            self.supports_state = supports_state(env)
        finally:
            try:
                env.close()
            except Exception as e:  # it was built only to be probed: the server goes on
                logger.warning("%s close() raised %s: %s", self.env_id, type(e).__name__, e)

    def app(self) -> web.Application:
        """The aiohttp application (its startup starts the idle-session reaper)."""
        app = web.Application(client_max_size=MAX_MESSAGE_BYTES)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metadata", self._metadata)
        app.router.add_get("/schema", self._schema)
        app.router.add_get("/agentrl", self._info)
        app.router.add_post("/reset", self._http_reset)
        app.router.add_post("/step", self._http_step)
        app.router.add_get("/state", self._http_state)
        app.router.add_get("/ws", self._ws)
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 8100) -> None:
        """Listen on ``host:port`` (returns once listening; :meth:`stop` ends it)."""
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=5.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()

    async def stop(self) -> None:
        """Close every session (and its env), then stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _on_startup(self, app: web.Application) -> None:
        self._background.start(self._reap(), name="serve-env-reaper")

    async def _on_cleanup(self, app: web.Application) -> None:
        await self._background.close()

    async def _on_shutdown(self, app: web.Application) -> None:
        for session in list(self.sessions.values()):
            session.closing = "the env server is shutting down"
            if session.ws is not None:
                with connection_gone(f"closing session {session.id}"):
                    await session.ws.close(code=1001, message=b"server shutting down")

    async def _reap(self) -> None:
        """Close sessions idle for longer than ``idle_timeout_s``."""
        interval = min(max(self.idle_timeout_s / 4, 0.2), 5.0)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for s in list(self.sessions.values()):
                if not s.busy and not s.closing and now - s.last_active > self.idle_timeout_s:
                    s.closing = (
                        f"the session was idle for more than {self.idle_timeout_s:g} s "
                        "(agentrl serve-env --idle-timeout-s) and was closed"
                    )
                    self.counters["sessions_idle_closed"] += 1
                    if s.ws is not None:
                        with connection_gone(f"closing idle session {s.id}"):
                            await s.ws.send_json(
                                P.error(s.closing, P.SESSION_ERROR, "env_unavailable")
                            )
                            await s.ws.close(code=4000, message=b"idle timeout")

    # -- HTTP routes ------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        failure = self._background.failure
        if failure is not None:  # idle sessions are no longer closed: take it out
            reason = f"the idle-session reaper crashed: {type(failure).__name__}: {failure}"
            return web.json_response({"status": "unhealthy", "reason": reason}, status=503)
        return web.json_response({"status": "healthy"})

    async def _metadata(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "name": self.env_id,
                "version": _version(),
                "author": None,
                "description": f"{self.env_id}, an agentrl text env (agentrl serve-env)",
                "readme_content": None,
                "documentation_url": None,
            }
        )

    async def _schema(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"action": ACTION_SCHEMA, "observation": OBSERVATION_SCHEMA, "state": STATE_SCHEMA}
        )

    async def _info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "protocol": P.PROTOCOL_VERSION,
                "env_id": self.env_id,
                "sessions": len(self.sessions),
                "max_sessions": self.max_sessions,
                "supports_state": self.supports_state,
                "counters": dict(self.counters),
            }
        )

    async def _http_reset(self, request: web.Request) -> web.Response:
        """Stateless, as OpenEnv's: a fresh env, reset, its first observation, closed."""
        body = await _json_body(request)
        try:
            seed, options = reset_args(body)
        except P.Malformed as e:
            return web.json_response({"detail": str(e)}, status=422)
        return await self._stateless(seed, options, None)

    async def _http_step(self, request: web.Request) -> web.Response:
        """Stateless, as OpenEnv's: a fresh env, reset (``seed`` if given), one step."""
        body = await _json_body(request)
        action = body.get("action")
        try:
            seed, options = reset_args(body)
            if not isinstance(action, dict) or not isinstance(action.get(P.ACTION_FIELD), str):
                raise P.Malformed(f"action must be an object with a string {P.ACTION_FIELD!r}")
        except P.Malformed as e:
            return web.json_response({"detail": str(e)}, status=422)
        return await self._stateless(seed, options, action[P.ACTION_FIELD])

    async def _http_state(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"episode_id": None, "step_count": 0, "env_id": self.env_id, "env_state": None}
        )

    async def _stateless(
        self, seed: int | None, options: dict[str, Any] | None, action: str | None
    ) -> web.Response:
        session = Session("http")
        try:
            session.handle = await self._call(session, "make", self._build)
            session.toolset = ToolSet(session.handle.tools, timeout_s=self.tool_timeout_s)
            reply = await self._reset(session, {"seed": seed, "options": options})
            if action is not None and reply["type"] == "observation":
                reply = await self._step(session, {P.ACTION_FIELD: action})
        except EnvCallError as e:
            reply = P.error(str(e), P.EXECUTION_ERROR, e.kind)
        finally:
            await self._close_env(session)
        if reply["type"] == "error":
            return web.json_response(
                {"detail": reply["data"]["message"], **reply["data"]}, status=500
            )
        return web.json_response(reply["data"])

    # -- sessions ---------------------------------------------------------------------------

    async def _ws(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES)
        try:
            await ws.prepare(request)
        except ConnectionError:  # the client left during the handshake (e.g. its run ended)
            return web.Response(status=400)  # never sent: aiohttp drops it quietly
        if len(self.sessions) >= self.max_sessions:
            self.counters["sessions_refused"] += 1
            await ws.send_json(
                P.error(
                    f"the env server holds its maximum of {self.max_sessions} sessions "
                    "(agentrl serve-env --max-sessions)",
                    P.CAPACITY_REACHED,
                    active_sessions=len(self.sessions),
                    max_sessions=self.max_sessions,
                )
            )
            await ws.close()
            return ws
        session = Session(uuid.uuid4().hex, ws)
        self.sessions[session.id] = session
        self.counters["sessions"] += 1
        try:
            try:
                session.handle = await self._call(session, "make", self._build)
            except EnvCallError as e:
                await ws.send_json(P.error(str(e), P.FACTORY_ERROR, e.kind))
                return ws
            session.toolset = ToolSet(session.handle.tools, timeout_s=self.tool_timeout_s)
            async for msg in ws:
                if msg.type == WSMsgType.BINARY:
                    reply: dict[str, Any] | None = P.error(
                        "binary messages are not part of the protocol; send JSON text",
                        P.INVALID_JSON,
                    )
                elif msg.type != WSMsgType.TEXT:
                    break
                else:
                    session.busy = True
                    try:
                        reply = await self._message(session, msg.data)
                    finally:
                        session.busy, session.last_active = False, time.monotonic()
                if reply is None or ws.closed:
                    break
                await ws.send_str(self._encode(reply))
                if session.broken:
                    break
        except ConnectionError:
            pass  # the client went away: the env is closed below
        except asyncio.CancelledError:
            raise  # the server stops (or aiohttp cancels a dropped client's handler)
        finally:
            del self.sessions[session.id]
            await self._close_env(session)
            with connection_gone(f"closing session {session.id}"):
                await ws.close()
        return ws


async def _json_body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("agentrl")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


async def serve_env(
    server: EnvServer, host: str, port: int, ready: Callable[[], None] | None = None
) -> None:
    """Serve until SIGINT or SIGTERM, then close every session."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await server.start(host, port)
    if ready is not None:
        ready()
    try:
        await stop.wait()
    finally:
        await server.stop()


__all__ = ["EnvServer", "serve_env"]
