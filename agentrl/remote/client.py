"""Envs that run on OpenEnv env servers: :class:`RemoteEnv` and :class:`EnvServerPool`.

:class:`EnvServerPool` is what ``[env] url``/``urls`` build: one or more env servers
(``agentrl serve-env``, or any OpenEnv server) behind one ``make`` for the runner. Each
:class:`RemoteEnv` it makes is an :class:`~agentrl.env.AsyncTextEnv` holding one
session (one WebSocket to ``/ws``, one env instance on the server) for its episode.

Routing
    A new session goes to the up server with the fewest sessions open (and below the
    ``max_sessions`` an agentrl server reports); while every server is full, new
    sessions wait for one to close.

Failure
    A server that refuses or drops a session, or does not answer a call within
    ``env.request_timeout_s``, is taken out of the rotation; only its episodes fail,
    with the reason ``env_unavailable`` (or ``env_timeout``) naming it, and the
    scheduler retries them (``rollout.max_retries``) on fresh sessions elsewhere. A
    session that cannot be opened is simply opened on another server, no episode lost.
    An answer that is not the protocol fails the episode with ``env_protocol``; an env
    that raises on the server, with ``env_exception``, as it would locally.

No server left
    New sessions wait up to ``env.reconnect_timeout_s`` for a server to come back; then
    the run stops with one :class:`~agentrl.errors.EnvServersUnavailable` that names
    every server and how it failed, and says how to continue (``agentrl train
    --resume``), as the inference pool does.

Health
    A background task checks ``/health`` of every server each ``health_interval_s``: a
    server that fails three checks in a row is taken out; one that is out is checked
    with a doubling delay (0.5 s up to 8 s) and taken back when it answers (and, if it
    is an agentrl server, still serves ``env.id``).

State
    Every answer of an agentrl server carries the env's ``get_state()`` snapshot, so
    :meth:`RemoteEnv.get_state` needs no round trip; ``aset_state`` restores one on the
    server (resume and forks). Other OpenEnv servers have no snapshots: their episodes
    resume by replaying the recorded actions.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Coroutine, Sequence
from typing import Any, TypeVar

import aiohttp

from agentrl.config import EnvConfig
from agentrl.env import AsyncTextEnv, Observation
from agentrl.errors import ConfigError, EnvServersUnavailable, InfraError, RemoteEnvError
from agentrl.remote import protocol as P
from agentrl.tools import Tool, ToolResult

logger = logging.getLogger(__name__)

T = TypeVar("T")

_FIRST_BACKOFF_S, _MAX_BACKOFF_S = 0.5, 8.0
_HEALTH_FAILURES_TO_DOWN = 3
_PROBE_TIMEOUT_S = 5.0
_MAX_MESSAGE_BYTES = 100 * 2**20


def http_url(url: str) -> str:
    """The HTTP base URL of a server given as http(s):// or ws(s)://."""
    url = url.rstrip("/")
    if url.startswith("ws://"):
        return "http://" + url[5:]
    if url.startswith("wss://"):
        return "https://" + url[6:]
    return url


@dataclasses.dataclass(eq=False)
class _Member:
    url: str
    up: bool = True
    load: int = 0
    """Sessions open on it now (and sessions being opened)."""
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
    failed_checks: int = 0
    backoff_s: float = _FIRST_BACKOFF_S
    next_try: float = 0.0
    reason: str = ""
    sessions: int = 0
    lost: int = 0
    """Sessions that failed with it (it died, hung, dropped them)."""


@dataclasses.dataclass(frozen=True)
class EnvServerEvent:
    """One change of an env server's state: ``down`` or ``up``."""

    at: float
    url: str
    event: str
    detail: str = ""


class EnvServerPool:
    """Env servers serving one env, behind the runner's ``make`` (module docstring).

    Use it as ``async with EnvServerPool(urls, env_id) as pool`` and give the runner
    ``make=pool.make``.

    Args:
        urls: the servers' base URLs (``http://host:port``).
        env_id: the env they serve (checked against agentrl servers; tasks carry it).
        request_timeout_s: deadline for one call to a server (and to open a session).
        reconnect_timeout_s: how long new sessions wait when no server is up.
        health_interval_s: seconds between ``/health`` checks of each server.
    """

    def __init__(
        self,
        urls: Sequence[str],
        env_id: str = "",
        *,
        request_timeout_s: float = 60.0,
        reconnect_timeout_s: float = 120.0,
        health_interval_s: float = 1.0,
    ) -> None:
        if not urls:
            raise ConfigError("an env server pool needs at least one server (env.url/env.urls)")
        self.members = [_Member(u.rstrip("/")) for u in urls]
        if len({m.url for m in self.members}) != len(self.members):
            raise ConfigError(f"env.url and env.urls list a server twice: {list(urls)}")
        self.env_id = env_id
        self.request_timeout_s = request_timeout_s
        self.reconnect_timeout_s = reconnect_timeout_s
        self.health_interval_s = health_interval_s
        self.events: list[EnvServerEvent] = []
        self.sessions_lost = 0
        """Sessions that failed with their server (each fails one episode attempt)."""
        self._turn = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http: aiohttp.ClientSession | None = None
        self._health: asyncio.Task[None] | None = None
        self._health_error: BaseException | None = None
        self._changed = asyncio.Event()
        self._closed = False

    @classmethod
    def from_config(cls, env: EnvConfig) -> EnvServerPool:
        """The pool of ``[env] url``/``urls``."""
        return cls(env.servers, env.id, request_timeout_s=env.request_timeout_s,
                   reconnect_timeout_s=env.reconnect_timeout_s,
                   health_interval_s=env.health_interval_s)  # fmt: skip

    async def __aenter__(self) -> EnvServerPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.close()
        except InfraError:
            if exc[1] is None:
                raise

    async def start(self) -> None:
        """Open the HTTP client, read each server's routes, start the health checks."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self._http = _client_session()
        await asyncio.gather(*(self._check(m) for m in self.members))
        self._health = asyncio.create_task(self._health_loop(), name="env-server-health")
        self._health.add_done_callback(self._watch)

    async def close(self) -> None:
        """Stop the health checks and the HTTP client (sessions close with their envs).

        Raises:
            InfraError: the health checks had crashed.
        """
        if self._closed:
            return
        self._closed = True
        if self._health is not None:
            self._health.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._health
        if self._http is not None:
            await self._http.close()
        self._raise_if_health_failed()

    def make(self, env_id: str | None = None, **kwargs: Any) -> RemoteEnv:
        """A remote env with no session yet (the runner's ``make``; runs in any thread).

        Raises:
            ConfigError: ``kwargs`` given (the server builds the env with its own).
        """
        if kwargs:
            raise ConfigError(
                f"env kwargs {kwargs} for an env on env servers: the server builds the env; "
                "give them there (agentrl serve-env ID --kwargs JSON)"
            )
        return RemoteEnv(self, env_id or self.env_id)

    def describe(self) -> list[dict[str, Any]]:
        """One row per server: url, up, sessions open, sessions lost, reason."""
        return [{"url": m.url, "up": m.up, "sessions": m.load, "capacity": m.capacity,
                 "opened": m.sessions, "lost": m.lost, "reason": m.reason}
                for m in self.members]  # fmt: skip

    # -- sessions ---------------------------------------------------------------------------

    async def open(
        self, http: aiohttp.ClientSession | None = None, *, wait: bool = True
    ) -> tuple[_Member, aiohttp.ClientWebSocketResponse]:
        """A new session on the least loaded up server.

        Args:
            http: the HTTP client to open it with (the pool's own by default; a remote
                env used synchronously brings one of its event loop).
            wait: wait for a server when none is up (up to ``reconnect_timeout_s``);
                False: fail at once (a remote env used synchronously).

        Raises:
            EnvServersUnavailable: no server came back within ``reconnect_timeout_s``.
            RemoteEnvError: ``wait`` is False and no server is up (``env_unavailable``).
        """
        if http is None:
            if self._loop is None:
                await self.start()
            http = self._http
        assert http is not None
        deadline: float | None = None
        while True:
            self._raise_if_health_failed()
            ready = [m for m in self.members
                     if m.up and (m.capacity is None or m.load < m.capacity)]  # fmt: skip
            if ready:
                turn = next(self._turn)
                member = min(ready, key=lambda m: (m.load, (self.members.index(m) - turn)
                                                   % len(self.members)))  # fmt: skip
                member.load += 1
                try:
                    ws = await self._connect(http, member)
                except asyncio.CancelledError:
                    self.release(member)
                    raise
                except (aiohttp.ClientError, OSError, TimeoutError) as e:
                    self.release(member)
                    self.down(member, f"cannot open a session: {describe_error(e)}")
                    continue
                member.sessions += 1
                return member, ws
            if not wait:
                raise RemoteEnvError("env_unavailable", "no env server is up: " + self._reasons())
            now = time.monotonic()
            if any(m.up for m in self.members):  # all full: wait for a session to close
                deadline = None
            else:
                deadline = deadline or now + self.reconnect_timeout_s
                if now >= deadline:
                    raise EnvServersUnavailable(
                        f"no env server answered for {self.reconnect_timeout_s:g} s "
                        f"(env.reconnect_timeout_s): {self._reasons()}. The episode store is "
                        "intact: start the env servers again (agentrl serve-env "
                        f"{self.env_id or 'ENV_ID'} --port PORT), then `agentrl train --resume "
                        "RUN_DIR` continues where this run stopped"
                    )
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0 if deadline is None else min(1.0, deadline - now)):
                    await changed.wait()

    async def _connect(self, http: aiohttp.ClientSession,
                       member: _Member) -> aiohttp.ClientWebSocketResponse:  # fmt: skip
        async with asyncio.timeout(self.request_timeout_s):
            return await http.ws_connect(
                http_url(member.url) + "/ws", max_msg_size=_MAX_MESSAGE_BYTES, autoping=True,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=5.0),
            )  # fmt: skip

    def release(self, member: _Member) -> None:
        """A session of ``member`` closed (any thread)."""
        member.load = max(member.load - 1, 0)
        self._notify()

    def full(self, member: _Member) -> None:
        """``member`` refused a session: it is at its limit with the sessions open now."""
        member.capacity = max(member.load - 1, 1)

    def down(self, member: _Member, reason: str) -> None:
        """Take ``member`` out of the rotation until its ``/health`` answers."""
        if not member.up:
            return
        member.up, member.reason, member.failed_checks = False, reason, 0
        member.backoff_s = _FIRST_BACKOFF_S
        member.next_try = time.monotonic() + member.backoff_s
        others = sum(m.up for m in self.members)
        logger.warning(
            "env server %s is down (%s); %s", member.url, reason,
            f"its episodes are retried on the {others} other server(s)" if others
            else "no other env server is up; new episodes wait for one to come back "
            f"(env.reconnect_timeout_s = {self.reconnect_timeout_s:g} s)",
        )  # fmt: skip
        self.events.append(EnvServerEvent(time.time(), member.url, "down", reason))
        self._notify()

    async def lost(self, member: _Member, reason: str, http: aiohttp.ClientSession) -> None:
        """A session of ``member`` broke: take it out unless ``/health`` still answers
        (then only that session was lost, e.g. closed by the server's idle timeout)."""
        member.lost += 1
        self.sessions_lost += 1
        if member.up and not await self._healthy(member, http, timeout_s=2.0):
            self.down(member, reason)

    def _reasons(self) -> str:
        return "; ".join(f"{m.url}: {m.reason or 'full'}" for m in self.members)

    def _notify(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()
        else:  # a remote env used from another thread
            loop.call_soon_threadsafe(self._notify)

    # -- health -----------------------------------------------------------------------------

    def _watch(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        self._health_error = task.exception()
        logger.error("the env server pool's health checks crashed; no env server is watched",
                     exc_info=self._health_error)  # fmt: skip
        self._notify()

    def _raise_if_health_failed(self) -> None:
        if self._health_error is not None:
            error = self._health_error
            raise InfraError(
                f"the env server pool's health checks crashed ({type(error).__name__}: "
                f"{error}; the traceback is in the log). The episode store is intact: "
                "`agentrl train --resume RUN_DIR` continues the run"
            ) from error

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await asyncio.gather(*(self._check(m) for m in self.members))

    async def _check(self, m: _Member) -> None:
        assert self._http is not None
        if m.up and m.known:
            if await self._healthy(m, self._http):
                m.failed_checks = 0
            else:
                m.failed_checks += 1
                if m.failed_checks >= _HEALTH_FAILURES_TO_DOWN:
                    self.down(m, f"/health failed {m.failed_checks} times in a row")
            return
        if m.up or time.monotonic() >= m.next_try:
            problem = await self._learn(m, self._http)
            if problem is None:
                was_down = not m.up
                m.up, m.reason, m.failed_checks, m.backoff_s = True, "", 0, _FIRST_BACKOFF_S
                if was_down:
                    logger.warning("env server %s is back", m.url)
                    self.events.append(EnvServerEvent(time.time(), m.url, "up"))
                self._notify()
                return
            if m.up:
                self.down(m, problem)
            else:
                m.reason = problem
                m.backoff_s = min(m.backoff_s * 2, _MAX_BACKOFF_S)
                m.next_try = time.monotonic() + m.backoff_s

    async def _healthy(self, m: _Member, http: aiohttp.ClientSession,
                       timeout_s: float = _PROBE_TIMEOUT_S) -> bool:  # fmt: skip
        try:
            async with asyncio.timeout(min(timeout_s, self.request_timeout_s)):
                async with http.get(http_url(m.url) + "/health") as r:
                    return r.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False

    async def _learn(self, m: _Member, http: aiohttp.ClientSession) -> str | None:
        """Read a server's routes (health, agentrl info or action schema); None if it
        may take sessions, else why not."""
        try:
            async with asyncio.timeout(min(_PROBE_TIMEOUT_S, self.request_timeout_s)):
                async with http.get(http_url(m.url) + "/health") as r:
                    if r.status != 200:
                        return f"/health answered HTTP {r.status}"
                async with http.get(http_url(m.url) + "/agentrl") as r:
                    info = await r.json() if r.status == 200 else None
                schema = None
                if info is None:
                    async with http.get(http_url(m.url) + "/schema") as r:
                        schema = await r.json() if r.status == 200 else None
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
            return describe_error(e)
        return self._read_routes(m, info, schema)

    def _read_routes(self, m: _Member, info: Any, schema: Any) -> str | None:
        if isinstance(info, dict) and info.get("env_id"):
            m.agentrl, m.env_id = True, str(info["env_id"])
            if isinstance(info.get("max_sessions"), int):
                m.capacity = info["max_sessions"]
            if self.env_id and m.env_id != self.env_id:
                return f"it serves {m.env_id}, not {self.env_id} (env.id)"
        elif schema is not None:
            try:
                m.action_field = P.action_field_of(schema)
            except P.Malformed as e:
                return f"its /schema: {e}"
        m.known = True
        return None


def describe_error(e: BaseException) -> str:
    """A short account of a connection error (refused, reset, timed out)."""
    if isinstance(e, TimeoutError):
        return "timed out"
    if isinstance(e, aiohttp.WSServerHandshakeError):
        return f"the WebSocket handshake failed (HTTP {e.status})"
    cause = getattr(e, "os_error", None) or e
    text = str(cause) or type(cause).__name__
    return f"{type(cause).__name__}: {text}"[:300]


def _client_session() -> aiohttp.ClientSession:
    # limit=0: every session holds a connection (its WebSocket) for its whole episode
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout)


class _Refused(Exception):
    """The server refused the session (CAPACITY_REACHED): open it elsewhere."""


class _Closed(Exception):
    """The WebSocket closed under a request."""


@dataclasses.dataclass(eq=False)
class _Session:
    member: _Member
    ws: aiohttp.ClientWebSocketResponse
    http: aiohttp.ClientSession
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    owed: int = 0
    """Answers still to come for requests that were cancelled (a tool-call or env
    deadline of the runner): read and dropped before the next answer."""
    released: bool = False


class RemoteEnv(AsyncTextEnv):
    """A text env whose instance lives on an env server (one session per episode).

    Made by :meth:`EnvServerPool.make`. ``aopen`` takes the session (the rollout engine
    awaits it before the first reset, without the env deadline: it may wait for a
    server); ``areset``/``astep``/``aset_state``/``aclose`` are calls on it. Its tools
    and system prompt are the served env's, known after the reset. The sync
    ``reset``/``step``/``set_state``/``close`` (for replay checks and scripts) run the
    same calls on an event loop of the env's own, in a thread.
    """

    def __init__(self, pool: EnvServerPool, env_id: str) -> None:
        self.pool = pool
        self.env_id = env_id
        self.system_prompt: str | None = None  # type: ignore[misc]
        self.tools: tuple[Tool, ...] = ()  # type: ignore[misc]
        self.url = ""
        """The server of the current session ("" before the first one)."""
        self._session: _Session | None = None
        self._env_state: dict[str, Any] | None = None
        self._lost: RemoteEnvError | None = None
        self._rpc_ids = itertools.count(1)
        self._sync_loop: _LoopThread | None = None

    def __repr__(self) -> str:
        return f"RemoteEnv({self.env_id!r} on {self.url or 'no server yet'})"

    # -- the env contract -------------------------------------------------------------------

    async def aopen(self) -> None:
        """Take a session on a server (waits for one when none is up)."""
        if self._session is None:
            await self._open()

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        await super().areset(seed=seed)
        data: dict[str, Any] = {}
        if seed is not None:
            data["seed"] = seed
        if options is not None:
            data["options"] = options
        for _ in range(2 * len(self.pool.members) + 1):
            if self._session is None:
                await self._open()
            assert self._session is not None
            try:
                reply = await self._request({"type": "reset", "data": data}, "reset",
                                            "observation", refusable=True)  # fmt: skip
                break
            except _Refused:
                self.pool.full(self._session.member)
                await self._drop()
        else:
            raise RemoteEnvError("env_unavailable", "every env server refused a session (full): "
                                 + self.pool._reasons())  # fmt: skip
        obs, _, _, _, info, observation = self._fields(reply, "reset")
        self.system_prompt = _optional_str(observation.get("system_prompt"))
        specs = observation.get("tool_specs")
        if specs is None:  # another OpenEnv server: its MCP tools, if it has any
            specs = await self._list_tools()
        try:
            self.tools = tuple(RemoteTool(self, P.tool_schema(s)) for s in specs)
        except (P.Malformed, TypeError) as e:
            raise self._fail("env_protocol", f"sent bad tool specs at reset: {e}") from None
        return obs, info

    async def astep(self, action: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        assert self._session is not None, "step before reset"
        field = self._session.member.action_field
        reply = await self._request({"type": "step", "data": {field: action}}, "step",
                                    "observation")  # fmt: skip
        obs, reward, terminated, truncated, info, _ = self._fields(reply, "step")
        return obs, reward, terminated, truncated, info

    async def aset_state(self, state: dict[str, Any], steps: int = 0) -> None:
        """Restore a snapshot on the server (after ``steps`` steps)."""
        if self._session is None:
            raise RuntimeError("set_state before reset")
        reply = await self._request({"type": "set_state",
                                     "data": {"state": state, "steps": steps}},
                                    "set_state", "state")  # fmt: skip
        data = reply.get("data")
        snapshot = data.get("env_state") if isinstance(data, dict) else None
        self._env_state = snapshot if isinstance(snapshot, dict) else dict(state)

    def get_state(self) -> dict[str, Any]:
        """The env's snapshot after the last call (None: the server sends none)."""
        return self._env_state  # type: ignore[return-value]

    async def aclose(self) -> None:
        """Close the session (tell the server, then close the WebSocket)."""
        session = self._session
        if session is None:
            return
        if not self._lost and not session.lock.locked() and not session.ws.closed:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):
                    await session.ws.send_str('{"type": "close"}')
        await self._drop()

    def raise_if_lost(self) -> None:
        """Raise the failure that lost the session, if it was lost (see EnvHandle)."""
        if self._lost is not None:
            raise self._lost

    # -- sync use: a loop of its own, in a thread --------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        return self._sync(self.areset(seed=seed, options=options), "reset")

    def step(self, action: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        return self._sync(self.astep(action), "step")

    def set_state(self, state: dict[str, Any]) -> None:
        self._sync(self.aset_state(state), "set_state")

    def close(self) -> None:
        if self._sync_loop is None:
            if self._session is not None:
                logger.warning("%r was closed without its event loop; use `await aclose()`", self)
            return
        loop, self._sync_loop = self._sync_loop, None
        try:
            loop.run(self.aclose())
        finally:
            loop.stop()

    def _sync(self, coro: Coroutine[Any, Any, T], name: str) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise RuntimeError(f"{name}() of a remote env was called inside a running event "
                               f"loop; use `await env.a{name}(...)` instead")  # fmt: skip
        if self._session is not None and self._sync_loop is None:
            coro.close()
            raise RuntimeError(f"{self!r} holds a session on another event loop; use "
                               f"`await env.a{name}(...)` there")  # fmt: skip
        if self._sync_loop is None:
            self._sync_loop = _LoopThread()
        return self._sync_loop.run(coro)

    # -- the session ------------------------------------------------------------------------

    async def _open(self) -> None:
        own = self._sync_loop is not None
        http = self._sync_loop.http() if self._sync_loop is not None else None
        member, ws = await self.pool.open(http, wait=not own)
        self._session = _Session(member, ws, http or self.pool._http)  # type: ignore[arg-type]
        self._lost = None
        self.url = member.url

    async def _drop(self) -> None:
        session, self._session = self._session, None
        if session is None or session.released:
            return
        session.released = True
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                await session.ws.close()
        self.pool.release(session.member)

    async def _request(self, message: dict[str, Any], what: str, expect: str, *,
                       refusable: bool = False) -> dict[str, Any]:  # fmt: skip
        """Send one message and read its answer, under ``env.request_timeout_s``."""
        if self._lost is not None:
            raise self._lost
        session = self._session
        assert session is not None
        timeout_s = self.pool.request_timeout_s
        try:
            async with session.lock, asyncio.timeout(timeout_s):
                while session.owed:  # answers to requests that were cancelled
                    await self._receive(session)
                    session.owed -= 1
                await session.ws.send_str(json.dumps(message, allow_nan=False))
                session.owed += 1
                reply = await self._receive(session)
                session.owed -= 1
        except TimeoutError:
            error = self._fail(
                "env_timeout",
                f"did not answer {what} within {timeout_s:g} s (env.request_timeout_s); the "
                "server is left out until its /health answers",
            )  # fmt: skip
            self.pool.down(session.member, f"a {what} took longer than {timeout_s:g} s")
            session.member.lost += 1
            raise error from None
        except P.Malformed as e:
            raise self._fail(
                "env_protocol", f"answered {what} with a malformed message: {e}"
            ) from None
        except (_Closed, aiohttp.ClientError, ConnectionError) as e:
            detail = describe_error(e) if not isinstance(e, _Closed) else str(e)
            error = self._fail("env_unavailable", f"went away during {what} ({detail}); the "
                               "episode is retried on a fresh session")  # fmt: skip
            await self.pool.lost(session.member, f"a session broke during {what}: {detail}",
                                 session.http)  # fmt: skip
            raise error from None
        if reply["type"] == "error":
            self._error(reply.get("data"), what, refusable)
        if reply["type"] != expect:
            raise self._fail("env_protocol", f"answered {what} with a {reply['type']!r} message "
                             f"(expected {expect!r}): {P.short(reply)}")  # fmt: skip
        return reply

    async def _receive(self, session: _Session) -> dict[str, Any]:
        msg = await session.ws.receive()
        if msg.type == aiohttp.WSMsgType.TEXT:
            return P.decode(msg.data)
        if msg.type == aiohttp.WSMsgType.BINARY:
            raise P.Malformed("a binary message")
        code = session.ws.close_code
        raise _Closed(f"the WebSocket closed{f' with code {code}' if code else ''}")

    def _error(self, data: Any, what: str, refusable: bool) -> None:
        """Raise the failure an error message stands for."""
        data = data if isinstance(data, dict) else {}
        code, message = str(data.get("code", "")), str(data.get("message", "no message"))
        if code == P.CAPACITY_REACHED and refusable:
            raise _Refused(message)
        kind = data.get("kind")
        if kind not in ("env_exception", "env_timeout", "env_bad_observation", "env_unavailable",
                        "env_protocol"):  # fmt: skip
            kind = {P.EXECUTION_ERROR: "env_exception", P.FACTORY_ERROR: "env_exception",
                    P.SESSION_ERROR: "env_unavailable",
                    P.CAPACITY_REACHED: "env_unavailable"}.get(code, "env_protocol")  # fmt: skip
        if kind == "env_protocol":
            message = f"refused the {what} message: {message} ({code or 'no code'})"
        raise self._fail(str(kind), message)

    def _fail(self, kind: str, detail: str) -> RemoteEnvError:
        """The failure of this session (it takes no more calls); the caller raises it."""
        url = self._session.member.url if self._session is not None else self.url
        self._lost = RemoteEnvError(kind, f"{detail} (env server {url})", url)
        return self._lost

    def _fields(
        self, reply: dict[str, Any], what: str
    ) -> tuple[Any, float, bool, bool, dict[str, Any], dict[str, Any]]:
        assert self._session is not None
        try:
            fields = P.step_fields(reply.get("data"), self._session.member.action_field)
        except P.Malformed as e:
            raise self._fail("env_protocol", f"sent a malformed {what} result: {e}") from None
        snapshot = fields[5].get("env_state")
        self._env_state = snapshot if isinstance(snapshot, dict) else None
        return fields

    async def _list_tools(self) -> list[dict[str, Any]]:
        """The tools of another OpenEnv server's env (MCP ``tools/list``), or none."""
        assert self._session is not None
        member = self._session.member
        if not member.mcp:
            return []
        try:
            reply = await self._rpc("tools/list", {}, "tools/list")
        except RemoteEnvError as e:
            if e.kind != "env_protocol":
                raise
            self._lost, member.mcp = None, False  # no MCP there: envs without tools
            return []
        tools = reply.get("tools") if isinstance(reply, dict) else None
        return tools if isinstance(tools, list) else []

    async def _rpc(self, method: str, params: dict[str, Any], what: str) -> Any:
        rid = next(self._rpc_ids)
        request = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        reply = await self._request({"type": "mcp", "data": request}, what, "mcp")
        data = reply.get("data")
        if not isinstance(data, dict):
            raise self._fail("env_protocol", f"sent a malformed {what} answer: {P.short(data)}")
        if "error" in data:
            error = data["error"] if isinstance(data["error"], dict) else {}
            raise self._fail("env_protocol", f"{what} failed: {error.get('message', error)}")
        return data.get("result")

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one of the env's tools on the server; its result as the server gave it."""
        if self._session is None:
            raise RuntimeError("a tool call before reset")
        result = await self._rpc("tools/call", {"name": name, "arguments": arguments},
                                 f"tool call {name}")  # fmt: skip
        if not isinstance(result, dict):
            raise self._fail("env_protocol", f"sent a malformed tool result: {P.short(result)}")
        content = result.get("content")
        texts = [c.get("text", "") for c in content if isinstance(c, dict)] if isinstance(
            content, list) else []  # fmt: skip
        meta = result.get("_meta", {})
        ours = meta.get("agentrl", {}) if isinstance(meta, dict) else {}
        ours = ours if isinstance(ours, dict) else {}
        kind = ours.get("error") or ("tool_exception" if result.get("isError") else None)
        if "env_state" in ours:
            snapshot = ours["env_state"]
            self._env_state = snapshot if isinstance(snapshot, dict) else None
        return ToolResult(name, "".join(str(t) for t in texts), kind)


class RemoteTool(Tool):
    """One tool of a remote env: its schema from the server, its calls run there."""

    def __init__(self, env: RemoteEnv, schema: dict[str, Any]) -> None:
        self.env = env
        self.schema = schema
        self.name = schema["function"]["name"]
        self.timeout_s = None  # type: ignore[assignment]  # the ToolSet's: rollout.tool_timeout_s
        self.is_async = True
        self.fn = self._call

    async def _call(self, **arguments: Any) -> ToolResult:
        return await self.env.call_tool(self.name, arguments)

    async def __call__(self, arguments: Any) -> ToolResult:
        return await self.env.call_tool(self.name, dict(arguments))


class _LoopThread:
    """An event loop in a daemon thread, for a remote env used synchronously."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._http: aiohttp.ClientSession | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name="agentrl-remote-env")  # fmt: skip
        self._thread.start()

    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = _client_session()
        return self._http

    def run(self, coro: Awaitable[T]) -> T:
        async def wrapped() -> T:
            return await coro

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result()

    def stop(self) -> None:
        if self._http is not None:
            with contextlib.suppress(Exception):
                self.run(self._http.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


def _optional_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


# -- checking the servers of a config (before anything starts) ----------------------------


def check_servers(env: EnvConfig, *, timeout_s: float = _PROBE_TIMEOUT_S) -> EnvConfig:
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
        raise ConfigError(f"env.id is empty and the env server {next(iter(answers))} does not "
                          "name its env (/metadata); set env.id")  # fmt: skip
    return env if env_id == env.id else dataclasses.replace(env, id=env_id)


def _get_json(url: str, route: str, timeout_s: float) -> Any:
    with urllib.request.urlopen(http_url(url) + route, timeout=timeout_s) as r:
        return json.loads(r.read())


__all__ = ["EnvServerEvent", "EnvServerPool", "RemoteEnv", "RemoteTool", "check_servers"]
