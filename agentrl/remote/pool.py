"""``EnvServerPool``: several OpenEnv env servers behind one ``make``; routing, health, failover.

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

The server states, the health loop, the least-loaded choice and the wait for a server
are :class:`agentrl.serving.ServerSet`'s, shared with the inference pool. The remote
env itself (one session, its calls, its failures) is
:mod:`agentrl.remote.client`; the servers' state and addresses, :mod:`agentrl.remote.servers`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from agentrl.config import EnvConfig
from agentrl.errors import ConfigError, EnvServersUnavailable, InfraError, RemoteEnvError
from agentrl.remote import protocol as P
from agentrl.remote.client import RemoteEnv
from agentrl.remote.servers import (
    MAX_MESSAGE_BYTES,
    PROBE_TIMEOUT_S,
    Member,
    client_session,
    describe_error,
    http_url,
)
from agentrl.serving import ServerSet, Waiting

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EnvServerEvent:
    """One change of an env server's state: ``down`` or ``up``."""

    at: float
    url: str
    event: str
    detail: str = ""


def _health_crashed(error: BaseException) -> InfraError:
    return InfraError(
        f"the env server pool's health checks crashed ({type(error).__name__}: "
        f"{error}; the traceback is in the log). The episode store is intact: "
        "`agentrl train --resume RUN_DIR` continues the run"
    )


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
        self.members = [Member(u.rstrip("/")) for u in urls]
        if len({m.url for m in self.members}) != len(self.members):
            raise ConfigError(f"env.url and env.urls list a server twice: {list(urls)}")
        self.env_id = env_id
        self.request_timeout_s = request_timeout_s
        self.events: list[EnvServerEvent] = []
        self.sessions_lost = 0
        """Sessions that failed with their server (each fails one episode attempt)."""
        self._servers = ServerSet(
            self.members,
            owner="the env server pool's health checks",
            error=_health_crashed,
            health_interval_s=health_interval_s,
            reconnect_timeout_s=reconnect_timeout_s,
            rotate_ties=True,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http: aiohttp.ClientSession | None = None
        self._closed = False

    @classmethod
    def from_config(cls, env: EnvConfig) -> EnvServerPool:
        """The pool of ``[env] url``/``urls``."""
        return cls(
            env.servers,
            env.id,
            request_timeout_s=env.request_timeout_s,
            reconnect_timeout_s=env.reconnect_timeout_s,
            health_interval_s=env.health_interval_s,
        )

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
        self._servers.bind(self._loop)
        self._http = client_session()
        await self._servers.check_all(lambda m: self._check(m))
        self._servers.start_health(
            lambda m: self._check(m), name="env-server-health", check_first=False
        )

    async def close(self) -> None:
        """Stop the health checks and the HTTP client (sessions close with their envs).

        Raises:
            InfraError: the health checks had crashed.
        """
        if self._closed:
            return
        self._closed = True
        try:
            await self._servers.close()
        finally:
            if self._http is not None:
                await self._http.close()

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
        return [
            {
                "url": m.url,
                "up": m.up,
                "sessions": m.load,
                "capacity": m.capacity,
                "opened": m.sessions,
                "lost": m.lost,
                "reason": m.reason,
            }
            for m in self.members
        ]

    @property
    def health_interval_s(self) -> float:
        """Seconds between two rounds of ``/health`` checks (the server set's)."""
        return self._servers.health_interval_s

    @property
    def reconnect_timeout_s(self) -> float:
        """How long new work waits while no server is up (the server set's)."""
        return self._servers.reconnect_timeout_s

    @property
    def http(self) -> aiohttp.ClientSession | None:
        """The pool's HTTP client (None before :meth:`start`)."""
        return self._http

    # -- sessions ---------------------------------------------------------------------------

    async def open(
        self, http: aiohttp.ClientSession | None = None, *, wait: bool = True
    ) -> tuple[Member, aiohttp.ClientWebSocketResponse]:
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
        waiting = Waiting()  # across failed tries: the reconnect deadline goes on
        while True:
            member = await self._servers.wait_for_one(
                lambda m: m.capacity is None or m.load < m.capacity,
                self._unavailable,
                full=lambda m: True,  # an up server that is not ready is full: no deadline
                wait=wait,
                waiting=waiting,
            )
            if member is None:
                raise RemoteEnvError("env_unavailable", "no env server is up: " + self.reasons())
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

    def _unavailable(self) -> EnvServersUnavailable:
        return EnvServersUnavailable(
            f"no env server answered for {self.reconnect_timeout_s:g} s "
            f"(env.reconnect_timeout_s): {self.reasons()}. The episode store is "
            "intact: start the env servers again (agentrl serve-env "
            f"{self.env_id or 'ENV_ID'} --port PORT), then `agentrl train --resume "
            "RUN_DIR` continues where this run stopped"
        )

    async def _connect(
        self, http: aiohttp.ClientSession, member: Member
    ) -> aiohttp.ClientWebSocketResponse:
        async with asyncio.timeout(self.request_timeout_s):
            return await http.ws_connect(
                http_url(member.url) + "/ws",
                max_msg_size=MAX_MESSAGE_BYTES,
                autoping=True,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=5.0),
            )

    def release(self, member: Member) -> None:
        """A session of ``member`` closed (any thread)."""
        member.load = max(member.load - 1, 0)
        self._notify()

    def full(self, member: Member) -> None:
        """``member`` refused a session: it is at its limit with the sessions open now."""
        member.capacity = max(member.load - 1, 1)

    def down(self, member: Member, reason: str) -> None:
        """Take ``member`` out of the rotation until its ``/health`` answers."""
        if not member.take_down(reason):
            return
        others = sum(m.up for m in self.members)
        logger.warning(
            "env server %s is down (%s); %s",
            member.url,
            reason,
            f"its episodes are retried on the {others} other server(s)"
            if others
            else "no other env server is up; new episodes wait for one to come back "
            f"(env.reconnect_timeout_s = {self.reconnect_timeout_s:g} s)",
        )
        self.events.append(EnvServerEvent(time.time(), member.url, "down", reason))
        self._notify()

    async def lost(self, member: Member, reason: str, http: aiohttp.ClientSession) -> None:
        """A session of ``member`` broke: take it out unless ``/health`` still answers
        (then only that session was lost, e.g. closed by the server's idle timeout)."""
        member.lost += 1
        self.sessions_lost += 1
        if member.up and not await self._healthy(member, http, timeout_s=2.0):
            self.down(member, reason)

    def reasons(self) -> str:
        return "; ".join(f"{m.url}: {m.reason or 'full'}" for m in self.members)

    def _notify(self) -> None:
        self._servers.notify()

    # -- health -----------------------------------------------------------------------------

    async def _check(self, m: Member) -> None:
        assert self._http is not None
        if m.up and m.known:
            if await self._healthy(m, self._http):
                m.failed_checks = 0
            elif m.check_failed():
                self.down(m, f"/health failed {m.failed_checks} times in a row")
            return
        if m.up or m.due:
            problem = await self._learn(m, self._http)
            if problem is None:
                was_down = not m.up
                m.bring_up()
                if was_down:
                    logger.warning("env server %s is back", m.url)
                    self.events.append(EnvServerEvent(time.time(), m.url, "up"))
                self._notify()
                return
            if m.up:
                self.down(m, problem)
            else:
                m.retry_later(problem)

    async def _healthy(
        self, m: Member, http: aiohttp.ClientSession, timeout_s: float = PROBE_TIMEOUT_S
    ) -> bool:
        try:
            async with asyncio.timeout(min(timeout_s, self.request_timeout_s)):
                async with http.get(http_url(m.url) + "/health") as r:
                    return r.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False

    async def _learn(self, m: Member, http: aiohttp.ClientSession) -> str | None:
        """Read a server's routes (health, agentrl info or action schema); None if it
        may take sessions, else why not."""
        try:
            async with asyncio.timeout(min(PROBE_TIMEOUT_S, self.request_timeout_s)):
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

    def _read_routes(self, m: Member, info: Any, schema: Any) -> str | None:
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
