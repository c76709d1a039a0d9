"""``RemoteEnv``: a text env whose instance lives on an OpenEnv env server, one session an episode.

Each :class:`RemoteEnv` is an :class:`~agentrl.env.AsyncTextEnv` holding one session
(one WebSocket to ``/ws``, one env instance on the server) for its episode; its tools
(:class:`RemoteTool`) run there too. It takes its session from a pool
(:class:`SessionPool`; :class:`~agentrl.remote.pool.EnvServerPool` is the one) and tells
it how the session went: a server that refuses (full), times out or drops the session
is reported, and only this episode fails (``env_unavailable``, ``env_timeout``; an
answer that is not the protocol, ``env_protocol``; an env that raises on the server,
``env_exception``).

State
    Every answer of an agentrl server carries the env's ``get_state()`` snapshot, so
    :meth:`RemoteEnv.get_state` needs no round trip; ``aset_state`` restores one on the
    server (resume and forks). Other OpenEnv servers have no snapshots: their episodes
    resume by replaying the recorded actions.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import threading
from collections.abc import Awaitable, Coroutine, Sequence
from typing import Any, Protocol, TypeVar

import aiohttp

from agentrl.env import AsyncTextEnv, Observation
from agentrl.errors import RemoteEnvError
from agentrl.remote import protocol as P
from agentrl.remote.servers import (
    Member,
    check_servers,
    client_session,
    connection_gone,
    describe_error,
)
from agentrl.tools import Tool, ToolResult

logger = logging.getLogger(__name__)

T = TypeVar("T")


class SessionPool(Protocol):
    """What a remote env asks of the pool it takes its sessions from."""

    @property
    def members(self) -> Sequence[Member]:
        """The pool's servers."""
        ...

    @property
    def request_timeout_s(self) -> float:
        """The deadline of one call to a server (``env.request_timeout_s``)."""
        ...

    @property
    def http(self) -> aiohttp.ClientSession | None:
        """The pool's HTTP client (None before it started)."""
        ...

    async def open(
        self, http: aiohttp.ClientSession | None = None, *, wait: bool = True
    ) -> tuple[Member, aiohttp.ClientWebSocketResponse]:
        """A new session on the least loaded up server."""
        ...

    def release(self, member: Member) -> None:
        """A session of ``member`` closed."""
        ...

    def full(self, member: Member) -> None:
        """``member`` refused a session: it is at its limit."""
        ...

    def down(self, member: Member, reason: str) -> None:
        """Take ``member`` out of the rotation."""
        ...

    async def lost(self, member: Member, reason: str, http: aiohttp.ClientSession) -> None:
        """A session of ``member`` broke."""
        ...

    def reasons(self) -> str:
        """Why each server takes no session, in words."""
        ...


class _Refused(Exception):
    """The server refused the session (CAPACITY_REACHED): open it elsewhere."""


class _Closed(Exception):
    """The WebSocket closed under a request."""


@dataclasses.dataclass(eq=False)
class _Session:
    member: Member
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

    def __init__(self, pool: SessionPool, env_id: str) -> None:
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
                reply = await self._request(
                    {"type": "reset", "data": data}, "reset", "observation", refusable=True
                )
                break
            except _Refused:
                self.pool.full(self._session.member)
                await self._drop()
        else:
            raise RemoteEnvError(
                "env_unavailable",
                "every env server refused a session (full): " + self.pool.reasons(),
            )
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
        reply = await self._request(
            {"type": "step", "data": {field: action}}, "step", "observation"
        )
        obs, reward, terminated, truncated, info, _ = self._fields(reply, "step")
        return obs, reward, terminated, truncated, info

    async def aset_state(self, state: dict[str, Any], steps: int = 0) -> None:
        """Restore a snapshot on the server (after ``steps`` steps)."""
        if self._session is None:
            raise RuntimeError("set_state before reset")
        reply = await self._request(
            {"type": "set_state", "data": {"state": state, "steps": steps}}, "set_state", "state"
        )
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
            with connection_gone(f"telling {session.member.url} the session ends"):
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
            raise RuntimeError(
                f"{name}() of a remote env was called inside a running event "
                f"loop; use `await env.a{name}(...)` instead"
            )
        if self._session is not None and self._sync_loop is None:
            coro.close()
            raise RuntimeError(
                f"{self!r} holds a session on another event loop; use "
                f"`await env.a{name}(...)` there"
            )
        if self._sync_loop is None:
            self._sync_loop = _LoopThread()
        return self._sync_loop.run(coro)

    # -- the session ------------------------------------------------------------------------

    async def _open(self) -> None:
        own = self._sync_loop is not None
        http = self._sync_loop.http() if self._sync_loop is not None else None
        member, ws = await self.pool.open(http, wait=not own)
        self._session = _Session(member, ws, http or self.pool.http)  # type: ignore[arg-type]
        self._lost = None
        self.url = member.url

    async def _drop(self) -> None:
        session, self._session = self._session, None
        if session is None or session.released:
            return
        session.released = True
        with connection_gone(f"closing a session's WebSocket to {session.member.url}"):
            async with asyncio.timeout(2.0):
                await session.ws.close()
        self.pool.release(session.member)

    async def _request(
        self, message: dict[str, Any], what: str, expect: str, *, refusable: bool = False
    ) -> dict[str, Any]:
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
            )
            self.pool.down(session.member, f"a {what} took longer than {timeout_s:g} s")
            session.member.lost += 1
            raise error from None
        except P.Malformed as e:
            raise self._fail(
                "env_protocol", f"answered {what} with a malformed message: {e}"
            ) from None
        except (_Closed, aiohttp.ClientError, ConnectionError) as e:
            detail = describe_error(e) if not isinstance(e, _Closed) else str(e)
            error = self._fail(
                "env_unavailable",
                f"went away during {what} ({detail}); the episode is retried on a fresh session",
            )
            await self.pool.lost(
                session.member, f"a session broke during {what}: {detail}", session.http
            )
            raise error from None
        if reply["type"] == "error":
            self._error(reply.get("data"), what, refusable)
        if reply["type"] != expect:
            raise self._fail(
                "env_protocol",
                f"answered {what} with a {reply['type']!r} message "
                f"(expected {expect!r}): {P.short(reply)}",
            )
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
        if kind not in (
            "env_exception",
            "env_timeout",
            "env_bad_observation",
            "env_unavailable",
            "env_protocol",
        ):
            kind = {
                P.EXECUTION_ERROR: "env_exception",
                P.FACTORY_ERROR: "env_exception",
                P.SESSION_ERROR: "env_unavailable",
                P.CAPACITY_REACHED: "env_unavailable",
            }.get(code, "env_protocol")
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
        result = await self._rpc(
            "tools/call", {"name": name, "arguments": arguments}, f"tool call {name}"
        )
        if not isinstance(result, dict):
            raise self._fail("env_protocol", f"sent a malformed tool result: {P.short(result)}")
        content = result.get("content")
        texts = (
            [c.get("text", "") for c in content if isinstance(c, dict)]
            if isinstance(content, list)
            else []
        )
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
        self._thread = threading.Thread(
            target=self.loop.run_forever, daemon=True, name="agentrl-remote-env"
        )
        self._thread.start()

    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = client_session()
        return self._http

    def run(self, coro: Awaitable[T]) -> T:
        async def wrapped() -> T:
            return await coro

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result()

    def stop(self) -> None:
        if self._http is not None:
            with connection_gone("closing a remote env's HTTP client"):
                self.run(self._http.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


def _optional_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


__all__ = ["RemoteEnv", "RemoteTool", "SessionPool", "check_servers"]
