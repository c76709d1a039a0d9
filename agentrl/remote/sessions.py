"""A session of ``agentrl serve-env``: the answer to each message of one client's env.

:class:`SessionMessages` is the part of :class:`~agentrl.remote.server.EnvServer` that
answers a session's messages (``reset``, ``step``, ``state``, ``set_state``, ``mcp``
and OpenEnv's step-based tool calls) by calling the session's env through its
:class:`~agentrl.env.EnvHandle`, each call under the server's ``env_timeout_s``. The
server owns the routes, the WebSockets, the session limit and the idle reaper; this
module owns what one message does to one session's env.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from agentrl.env import EnvHandle, supports_state
from agentrl.remote import protocol as P
from agentrl.tools import ToolCall, ToolSet

logger = logging.getLogger(__name__)

_TOOL_ERROR_TYPES = {
    "unknown_tool": "tool_not_found",
    "bad_arguments": "invalid_args",
    "timeout": "timeout",
}
"""agentrl's tool error kinds as OpenEnv's ToolErrorType (others: execution_error)."""


class EnvCallError(Exception):
    """An env call failed; the session answers an error with this message and kind."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclasses.dataclass(eq=False)
class Session:
    """One client's session: its WebSocket, its env, its state."""

    id: str
    ws: web.WebSocketResponse | None = None
    """None for the stateless HTTP routes."""
    last_active: float = dataclasses.field(default_factory=time.monotonic)
    busy: bool = False
    broken: bool = False
    """An env call missed its deadline: the env is stuck, the session ends."""
    closing: str = ""
    handle: EnvHandle | None = None
    toolset: ToolSet | None = None
    episode_id: str | None = None


class SessionMessages:
    """Answers the messages of a session (a base class of the server; see the module docs)."""

    env_id: str
    kwargs: dict[str, Any]
    make: Callable[..., Any]
    env_timeout_s: float
    counters: Counter[str]

    async def _message(self, session: Session, text: str) -> dict[str, Any] | None:
        """The answer to one message (None: the client closed the session)."""
        try:
            message = json.loads(text)
        except ValueError as e:
            return P.error(f"Invalid JSON: {e}", P.INVALID_JSON)
        if not isinstance(message, dict):
            return P.error(
                f"a message is a JSON object, not {P.short(message)}", P.VALIDATION_ERROR
            )
        kind, data = message.get("type", ""), message.get("data", {})
        if data is None:
            data = {}
        if kind == "close":
            return None
        if not isinstance(data, dict):
            return P.error(f"data of a {kind!r} message must be an object", P.VALIDATION_ERROR)
        handlers: dict[str, Callable[[Session, dict[str, Any]], Awaitable[dict[str, Any]]]] = {
            "reset": self._reset,
            "step": self._step,
            "state": self._state,
            "set_state": self._set_state,
            "mcp": self._mcp,
        }
        handler = handlers.get(kind)
        if handler is None:
            return P.error(f"Unknown message type: {kind}", P.UNKNOWN_TYPE)
        try:
            reply = await handler(session, data)
        except P.Malformed as e:
            return P.error(str(e), P.VALIDATION_ERROR)
        except EnvCallError as e:
            return P.error(str(e), P.EXECUTION_ERROR, e.kind)
        return reply

    def _encode(self, reply: dict[str, Any]) -> str:
        """``reply`` as JSON text; an error if the env gave something that is not JSON."""
        try:
            return dumps(reply)
        except (TypeError, ValueError) as e:
            return dumps(
                P.error(
                    f"{self.env_id} returned something that is not JSON: {e}",
                    P.EXECUTION_ERROR,
                    "env_bad_observation",
                )
            )

    async def _reset(self, session: Session, data: dict[str, Any]) -> dict[str, Any]:
        handle = self._handle(session)
        seed, options = reset_args(data)
        episode_id = data.get("episode_id")
        reset = functools.partial(handle.reset, seed=seed, options=options)
        obs, info = await self._call(session, "reset", reset)
        session.episode_id = str(episode_id) if episode_id is not None else uuid.uuid4().hex
        self.counters["resets"] += 1
        observation = self._observation(session, obs, "reset()", False, info or {})
        observation["system_prompt"] = handle.system_prompt
        observation["tool_specs"] = self._tool_specs(session)
        return P.result(observation, None, False)

    async def _step(self, session: Session, data: dict[str, Any]) -> dict[str, Any]:
        if data.get("type") in ("list_tools", "call_tool"):  # OpenEnv's MCPToolClient
            return await self._step_tool(session, data)
        handle = self._handle(session)
        action = data.get(P.ACTION_FIELD)
        if not isinstance(action, str):
            raise P.Malformed(
                f"a step's action needs a string {P.ACTION_FIELD!r} field, got {P.short(data)}"
            )
        obs, reward, terminated, truncated, info = await self._call(
            session, "step", functools.partial(handle.step, action)
        )
        self.counters["steps"] += 1
        observation = self._observation(session, obs, "step()", bool(truncated), info or {})
        return P.result(observation, float(reward), bool(terminated or truncated))

    async def _state(self, session: Session, data: dict[str, Any]) -> dict[str, Any]:
        handle = self._handle(session)
        return {
            "type": "state",
            "data": {
                "episode_id": session.episode_id,
                "step_count": handle.steps,
                "env_id": self.env_id,
                "env_state": self._snapshot(session),
            },
        }

    async def _set_state(self, session: Session, data: dict[str, Any]) -> dict[str, Any]:
        handle = self._handle(session)
        state, steps = data.get("state"), data.get("steps", 0)
        if not isinstance(state, dict) or isinstance(steps, bool) or not isinstance(steps, int):
            raise P.Malformed("set_state needs {'state': object, 'steps': integer}")
        if not supports_state(handle.env):
            raise EnvCallError(f"{self.env_id} has no get_state/set_state", "env_exception")
        await self._call(session, "set_state", functools.partial(handle.set_state, state, steps))
        return await self._state(session, {})

    async def _mcp(self, session: Session, data: dict[str, Any]) -> dict[str, Any]:
        rid, method, params = data.get("id"), data.get("method"), data.get("params") or {}
        if not isinstance(params, dict):
            return P.rpc_error(rid, P.INVALID_PARAMS, "params must be an object")
        if method == "tools/list":
            return P.rpc_result(rid, {"tools": self._tool_specs(session)})
        if method != "tools/call":
            return P.rpc_error(rid, P.METHOD_NOT_FOUND, f"Method not found: {method}")
        name, arguments = params.get("name"), params.get("arguments") or {}
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return P.rpc_error(rid, P.INVALID_PARAMS, "tools/call needs a name and arguments")
        content, kind = await self._call_tool(session, name, arguments)
        return P.rpc_result(rid, P.tool_result(content, kind, self._snapshot(session)))

    async def _step_tool(self, session: Session, data: dict[str, Any]) -> dict[str, Any]:
        """OpenEnv's step-based tool calls: ListToolsAction and CallToolAction."""
        if data["type"] == "list_tools":
            tools = [
                {
                    "name": t["name"],
                    "description": t["description"],
                    "input_schema": t["inputSchema"],
                }
                for t in self._tool_specs(session)
            ]
            return P.result({"tools": tools}, None, False)
        name, arguments = data.get("tool_name"), data.get("arguments") or {}
        if not isinstance(name, str) or not isinstance(arguments, dict):
            raise P.Malformed("call_tool needs a string tool_name and an arguments object")
        content, kind = await self._call_tool(session, name, arguments)
        error = (
            None
            if kind is None
            else {"error_type": _TOOL_ERROR_TYPES.get(kind, "execution_error"), "message": content}
        )
        return P.result({"tool_name": name, "result": content, "error": error}, 0.0, False)

    async def _call_tool(
        self, session: Session, name: str, arguments: dict[str, Any]
    ) -> tuple[str, str | None]:
        assert session.toolset is not None
        self._handle(session)
        self.counters["tool_calls"] += 1
        result = await session.toolset.call(ToolCall(name, arguments))
        return result.content, result.error

    # -- env calls --------------------------------------------------------------------------

    def _handle(self, session: Session) -> EnvHandle:
        if session.handle is None:
            raise EnvCallError(
                f"the session's env {self.env_id} could not be made", "env_exception"
            )
        return session.handle

    async def _build(self) -> EnvHandle:
        return await EnvHandle.build(
            self.make, self.env_id, dict(self.kwargs), thread_name="serve-env"
        )

    async def _call(self, session: Session, name: str, fn: Callable[[], Awaitable[Any]]) -> Any:
        try:
            async with asyncio.timeout(self.env_timeout_s):
                return await fn()
        except TimeoutError:
            session.broken = True  # its worker thread (or coroutine) is stuck: end it
            self.counters["env_timeouts"] += 1
            raise EnvCallError(
                f"{name} took longer than {self.env_timeout_s:g} s on the env server "
                "(agentrl serve-env --env-timeout-s); the session is closed",
                "env_timeout",
            ) from None
        except Exception as e:
            self.counters["env_exceptions"] += 1
            raise EnvCallError(f"{name} raised {type(e).__name__}: {e}", "env_exception") from e

    def _observation(
        self, session: Session, obs: Any, where: str, truncated: bool, info: Mapping[str, Any]
    ) -> dict[str, Any]:
        try:
            return P.text_observation(
                obs, truncated=truncated, info=info, env_state=self._snapshot(session)
            )
        except TypeError as e:
            raise EnvCallError(
                f"{self.env_id} {where} returned {e}; expected a str, or a list of "
                "{'role': ..., 'content': str} messages",
                "env_bad_observation",
            ) from None

    def _snapshot(self, session: Session) -> dict[str, Any] | None:
        if session.handle is None:
            return None
        try:
            return session.handle.get_state()
        except Exception as e:  # the client then resumes by replaying the actions
            logger.warning("%s get_state() raised %s: %s", self.env_id, type(e).__name__, e)
            return None

    def _tool_specs(self, session: Session) -> list[dict[str, Any]]:
        return [P.tool_spec(s) for s in (session.toolset.schemas if session.toolset else [])]

    async def _close_env(self, session: Session) -> None:
        handle, session.handle = session.handle, None
        if handle is None:
            return
        if session.toolset is not None:  # its tools' sessions (MCP) end with it
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.env_timeout_s):
                    await session.toolset.aclose()
        try:
            if session.broken:  # its thread is stuck: close in a spare one, do not wait long
                async with asyncio.timeout(1.0):
                    await handle.close()
            else:
                async with asyncio.timeout(self.env_timeout_s):
                    await handle.close()
        except Exception as e:
            logger.warning(
                "closing a %s session's env failed: %s: %s", self.env_id, type(e).__name__, e
            )
        finally:
            handle.abandon()


def reset_args(data: Mapping[str, Any]) -> tuple[int | None, dict[str, Any] | None]:
    seed, options = data.get("seed"), data.get("options")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise P.Malformed(f"seed must be a non-negative integer or null, got {seed!r}")
    if options is not None and not isinstance(options, dict):
        raise P.Malformed(f"options must be an object or null, got {P.short(options)}")
    return seed, options


def dumps(message: Mapping[str, Any]) -> str:
    return json.dumps(message, allow_nan=False)
