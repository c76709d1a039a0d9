"""The OpenEnv wire protocol, as agentrl's env server and client speak it.

OpenEnv (``openenv-core``) env servers expose these routes; agentrl's server
(:mod:`agentrl.remote.server`) serves every one of them, its client
(:mod:`agentrl.remote.client`) needs only ``/health`` and ``/ws``::

    GET  /health     {"status": "healthy"}
    GET  /metadata   {"name": ..., "description": ..., "version": ...}
    GET  /schema     {"action": JSON schema, "observation": ..., "state": ...}
    POST /reset      {"seed": 3}  -> RESULT   (stateless: a fresh env for this call)
    POST /step       {"action": ACTION} -> RESULT   (stateless as well)
    GET  /state      STATE of a fresh env
    WS   /ws         one session (one env instance) per connection, JSON text messages:
        {"type": "reset", "data": {"seed": 3, "options": {...}}}
                                    -> {"type": "observation", "data": RESULT}
        {"type": "step", "data": ACTION}  -> {"type": "observation", "data": RESULT}
        {"type": "state"}                 -> {"type": "state", "data": STATE}
        {"type": "mcp", "data": JSON-RPC 2.0 request}
                                    -> {"type": "mcp", "data": JSON-RPC 2.0 response}
        {"type": "close"}
        any failure: {"type": "error", "data": {"message": ..., "code": WSErrorCode}}

with ``RESULT = {"observation": {...}, "reward": float | None, "done": bool}``. The
server answers a session's messages one at a time, in order.

How agentrl's text envs fill it in:

* ``ACTION = {"message": "the model's turn"}`` (``metadata`` allowed, as OpenEnv's
  ``Action``); ``{"type": "list_tools"}`` and ``{"type": "call_tool", "tool_name": ...,
  "arguments": {...}}`` are OpenEnv's step-based tool calls (``MCPToolClient``).
* ``RESULT.observation = {"text": str | None, "messages": [chat messages] | None,
  "truncated": bool, "info": {...}, "env_state": {...} | None}``: a string observation
  in ``text``, chat messages in ``messages``; ``done`` is terminated or truncated;
  ``env_state`` is the env's ``get_state()`` after the call when it has one (so the
  trainer's checkpoints hold it without another round trip). A reset's observation
  also holds ``system_prompt`` and ``tool_specs`` (its tools, as MCP tool specs).
* ``STATE = {"episode_id", "step_count", "env_id", "env_state"}``.
* Tools through MCP: ``tools/list`` gives ``{"tools": [{"name", "description",
  "inputSchema"}]}``, ``tools/call`` with ``{"name", "arguments"}`` gives ``{"content":
  [{"type": "text", "text": ...}], "isError": bool, "_meta": {"agentrl": {"error":
  tool error kind | None, "env_state": ...}}}``.
* Extensions, which other OpenEnv servers do not have: the message ``{"type":
  "set_state", "data": {"state": {...}, "steps": n}} -> STATE`` (resume and forks), the
  route ``GET /agentrl`` (``protocol``, ``env_id``, ``sessions``, ``max_sessions``,
  ``supports_state``), and ``"kind"`` (a failure kind such as ``env_exception``) in
  error data.

This module holds the message shapes and their checks only; no I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from agentrl.jsondata import jsonable

PROTOCOL_VERSION = 1
"""The version of agentrl's extensions (``GET /agentrl`` reports it)."""

ACTION_FIELD = "message"
"""The field of the step action that holds the model's text."""

# OpenEnv's WSErrorCode values
INVALID_JSON = "INVALID_JSON"
UNKNOWN_TYPE = "UNKNOWN_TYPE"
VALIDATION_ERROR = "VALIDATION_ERROR"
EXECUTION_ERROR = "EXECUTION_ERROR"
CAPACITY_REACHED = "CAPACITY_REACHED"
FACTORY_ERROR = "FACTORY_ERROR"
SESSION_ERROR = "SESSION_ERROR"

# JSON-RPC 2.0 error codes (MCP)
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602


class Malformed(ValueError):
    """A message that is not the protocol (the client turns it into ``env_protocol``)."""


def error(message: str, code: str, kind: str | None = None, **extra: Any) -> dict[str, Any]:
    """An error message; ``kind`` (agentrl's extension) says how the episode failed."""
    data: dict[str, Any] = {"message": message, "code": code, **extra}
    if kind is not None:
        data["kind"] = kind
    return {"type": "error", "data": data}


def result(observation: dict[str, Any], reward: float | None, done: bool) -> dict[str, Any]:
    """An observation message (the answer to reset and step)."""
    return {
        "type": "observation",
        "data": {"observation": observation, "reward": reward, "done": done},
    }


def text_observation(
    obs: Any, *, truncated: bool, info: Mapping[str, Any], env_state: dict[str, Any] | None
) -> dict[str, Any]:
    """The observation fields of a text env's reset or step.

    Raises:
        TypeError: ``obs`` is neither a str (or None) nor a list (of chat messages).
    """
    if obs is None or isinstance(obs, str):
        text, messages = obs, None
    elif isinstance(obs, list):
        text, messages = None, obs
    else:
        raise TypeError(f"a {type(obs).__name__} ({obs!r:.120})")
    return {
        "text": text,
        "messages": messages,
        "truncated": truncated,
        "info": jsonable(info, allow_nan=False),
        "env_state": env_state,
    }


def tool_spec(schema: Mapping[str, Any]) -> dict[str, Any]:
    """An MCP tool spec from an agentrl tool schema (``{"type": "function", ...}``)."""
    fn = schema.get("function", schema)
    return {
        "name": fn["name"],
        "description": fn.get("description", ""),
        "inputSchema": fn.get("parameters", {"type": "object", "properties": {}}),
    }


def tool_schema(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The agentrl tool schema of an MCP tool spec (``inputSchema`` or ``input_schema``).

    Raises:
        Malformed: the spec has no name or its input schema is not an object.
    """
    name = spec.get("name") if isinstance(spec, Mapping) else None
    params = spec.get("inputSchema", spec.get("input_schema", {})) if name else None
    if not isinstance(name, str) or not name or not isinstance(params, dict):
        raise Malformed(f"a tool spec without a name or input schema: {spec!r:.200}")
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": str(spec.get("description") or ""),
            "parameters": params,
        },
    }


def tool_result(
    content: str, error_kind: str | None, env_state: dict[str, Any] | None
) -> dict[str, Any]:
    """The MCP ``tools/call`` result of one tool call."""
    return {
        "content": [{"type": "text", "text": content}],
        "isError": error_kind is not None,
        "_meta": {"agentrl": {"error": error_kind, "env_state": env_state}},
    }


def rpc_result(request_id: Any, value: Any) -> dict[str, Any]:
    return {"type": "mcp", "data": {"jsonrpc": "2.0", "id": request_id, "result": value}}


def rpc_error(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {
        "type": "mcp",
        "data": {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}},
    }


# -- reading answers (the client) ----------------------------------------------------------


def decode(text: str | bytes) -> dict[str, Any]:
    """One message as a dict with a ``type``.

    Raises:
        Malformed: not JSON, not an object, or without a string ``type``.
    """
    try:
        message = json.loads(text)
    except (TypeError, ValueError) as e:
        raise Malformed(f"not JSON ({e}): {short(text)}") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise Malformed(f"not a message object with a type: {short(text)}")
    return message


def step_fields(
    data: Any, action_field: str
) -> tuple[Any, float, bool, bool, dict[str, Any], dict[str, Any]]:
    """``(obs, reward, terminated, truncated, info, observation)`` of a RESULT.

    agentrl's observations give ``text`` or ``messages``; another OpenEnv env's
    observation becomes text: its only string field (other than ``action_field``), else
    its fields as JSON. ``done`` without ``truncated`` means terminated.

    Raises:
        Malformed: not a RESULT (no observation object, a reward that is not a number,
            ``done`` that is not a bool).
    """
    if not isinstance(data, dict) or not isinstance(data.get("observation"), dict):
        raise Malformed(f"no observation object in {short(data)}")
    observation: dict[str, Any] = data["observation"]
    reward, done = data.get("reward"), data.get("done", False)
    if reward is None:
        reward = 0.0
    if isinstance(reward, bool) or not isinstance(reward, int | float) or math.isnan(reward):
        raise Malformed(f"reward {reward!r} is not a number")
    if not isinstance(done, bool):
        raise Malformed(f"done {done!r} is not a bool")
    truncated = observation.get("truncated", False)
    if not isinstance(truncated, bool):
        raise Malformed(f"truncated {truncated!r} is not a bool")
    info = observation.get("info", {})
    if not isinstance(info, dict):
        raise Malformed(f"info {short(info)} is not an object")
    if "text" in observation or "messages" in observation:
        messages = observation.get("messages")
        obs = messages if messages is not None else observation.get("text")
        if not (obs is None or isinstance(obs, str | list)):
            raise Malformed(f"the observation's text is a {type(obs).__name__}")
    else:
        obs = foreign_text(observation, action_field)
    return obs, float(reward), done and not truncated, truncated, info, observation


def foreign_text(observation: Mapping[str, Any], action_field: str = ACTION_FIELD) -> str:
    """The text of another OpenEnv env's observation (see :func:`step_fields`)."""
    fields = {k: v for k, v in observation.items() if k not in ("metadata", "done", "reward")}
    strings = [v for k, v in fields.items() if isinstance(v, str) and k != action_field]
    if len(strings) == 1:
        return strings[0]
    return json.dumps(fields, sort_keys=True, default=str)


def action_field_of(schema: Any) -> str:
    """The field of a server's action that takes the model's text (from ``/schema``):
    ``message`` when the action has one, else its only required string field.

    Raises:
        Malformed: the action schema has no such field.
    """
    action = schema.get("action") if isinstance(schema, dict) else None
    props = action.get("properties") if isinstance(action, dict) else None
    if not isinstance(props, dict):
        raise Malformed(f"/schema has no action properties: {short(schema)}")
    strings = [k for k, v in props.items() if isinstance(v, dict) and v.get("type") == "string"]
    if ACTION_FIELD in strings:
        return ACTION_FIELD
    required = [k for k in action.get("required", []) if k in strings]
    if len(required) == 1:
        return required[0]
    if len(strings) == 1:
        return strings[0]
    raise Malformed(
        f"cannot tell which field of the action takes the model's text: string fields "
        f"{strings}, required {action.get('required', [])}"
    )


def short(value: Any, limit: int = 200) -> str:
    """``value`` as text of at most ``limit`` characters (for error messages)."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
