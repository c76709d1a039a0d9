"""Tools: typed Python functions the agent may call, and parsing the model's calls.

A tool is a function (sync or async) with type hints and a Google-style docstring; its
JSON schema comes from ``transformers.utils.get_json_schema``. :class:`ToolSet` runs
calls with a per-call timeout and turns every failure (malformed JSON, unknown tool,
wrong argument types, a call cut off by the length limit, an exception, a timeout)
into an error message for the model plus a counted kind, never an exception.

Owns :class:`Tool`, :class:`ToolCall`, :class:`ToolResult`, :class:`ToolSet`, the
:class:`ParsedTurn` a parser returns and the :class:`ToolCallParser` seam. Reading calls
out of a model's text is the parser's job: :mod:`agentrl.chat.toolcalls` wraps vLLM's
maintained parsers, one per model family. Does not render conversations or talk to the
model.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol

logger = logging.getLogger(__name__)

ToolErrorKind = Literal[
    "malformed_json", "cut_off", "unknown_tool", "bad_arguments", "tool_exception", "timeout"
]

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCall:
    """One parsed call: the tool's name, its arguments, and the id its result answers to."""

    name: str
    arguments: Mapping[str, Any]
    id: str | None = None
    """Set by formats whose tool results name the call they answer (Mistral's 9-character
    ids); None elsewhere."""


@dataclasses.dataclass(frozen=True, slots=True)
class ToolResult:
    """What goes back to the model: the content, and the error kind if it failed."""

    name: str
    content: str
    error: ToolErrorKind | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ParsedTurn:
    """The tool calls found in one assistant turn, and what could not be parsed."""

    calls: tuple[ToolCall, ...]
    errors: tuple[ToolResult, ...]

    @property
    def has_tool_activity(self) -> bool:
        return bool(self.calls or self.errors)


class ToolCallParser(Protocol):
    """Reads the tool calls of one assistant turn in a model family's format.

    Implemented by :class:`agentrl.chat.toolcalls.ToolCallFormat`.
    """

    def parse(
        self,
        text: str,
        tools: Sequence[Mapping[str, Any]],
        *,
        finish_reason: str = "stop",
        turn: int = 0,
    ) -> ParsedTurn:
        """The calls in ``text`` (the turn's answer, reasoning removed) and what failed.

        Args:
            text: the assistant turn's text.
            tools: the JSON schemas of the tools on offer.
            finish_reason: ``"length"`` when the turn hit its token limit (a call that
                does not parse then counts as ``cut_off``).
            turn: the assistant turn's index, for deterministic call ids.
        """
        ...


class Tool:
    """A typed function plus its JSON schema.

    Args:
        fn: a sync or async function with type hints and a Google-style docstring.
        timeout_s: per-call deadline.
    """

    def __init__(self, fn: Callable[..., Any], *, timeout_s: float = 10.0) -> None:
        from transformers.utils import get_json_schema

        self.fn = fn
        self.timeout_s = timeout_s
        try:
            self.schema: dict[str, Any] = get_json_schema(fn)
        except Exception as e:
            raise TypeError(
                f"tool {getattr(fn, '__name__', fn)!r} needs type hints on every argument and "
                f"a Google-style docstring with an Args section: {e}"
            ) from e
        self.name: str = self.schema["function"]["name"]
        self.is_async = inspect.iscoroutinefunction(fn)

    def check_arguments(self, arguments: Mapping[str, Any]) -> str | None:
        """An error message if ``arguments`` do not fit the schema, else None."""
        params = self.schema["function"].get("parameters", {})
        props: dict[str, Any] = params.get("properties", {})
        missing = [p for p in params.get("required", []) if p not in arguments]
        if missing:
            return f"missing required arguments {missing}; expected {sorted(props)}"
        unknown = [a for a in arguments if a not in props]
        if unknown:
            return f"unknown arguments {unknown}; expected {sorted(props)}"
        for key, value in arguments.items():
            kind = props[key].get("type")
            kinds = kind if isinstance(kind, list) else [kind]
            allowed = tuple(t for k in kinds if k in _JSON_TYPES for t in _JSON_TYPES[k])
            if value is None and "null" in kinds:
                continue
            bad_bool = isinstance(value, bool) and bool not in allowed
            if allowed and (not isinstance(value, allowed) or bad_bool):
                return f"argument {key!r} must be {kind}, got {type(value).__name__} {value!r}"
        return None

    async def __call__(self, arguments: Mapping[str, Any]) -> Any:
        if self.is_async:
            return await self.fn(**arguments)
        # Sync tools run in a thread so a slow tool never stalls the event loop.
        return await asyncio.to_thread(self.fn, **arguments)


class ToolSet:
    """The tools of one env, by name; runs parsed calls and counts errors by kind."""

    def __init__(self, tools: Iterable[Callable[..., Any] | Tool], *, timeout_s: float = 10.0):
        self.tools: dict[str, Tool] = {}
        sessions: dict[Any, Any] = {}  # what tools of one server share in this episode
        for item in tools:
            tool = item if isinstance(item, Tool) else Tool(item, timeout_s=timeout_s)
            for_episode = getattr(tool, "for_episode", None)
            if callable(for_episode):  # a tool with a session per episode (an MCP server's)
                tool = for_episode(sessions)
            if tool.timeout_s is None:  # a tool that takes its set's deadline (a remote one)
                tool = copy.copy(tool)
                tool.timeout_s = timeout_s
            if tool.name in self.tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            self.tools[tool.name] = tool
        self.errors: Counter[str] = Counter()

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self.tools.values()]

    @property
    def holds_sessions(self) -> bool:
        """Whether a tool holds something to close (:meth:`aclose` has work to do)."""
        return any(callable(getattr(t, "aclose", None)) for t in self.tools.values())

    async def aclose(self) -> None:
        """Close what the tools hold for this episode (an MCP session); never raises."""
        for tool in self.tools.values():
            aclose = getattr(tool, "aclose", None)
            if callable(aclose):
                try:
                    await aclose()
                except Exception as e:  # the episode's result stands; say what failed
                    logger.warning("closing tool %s failed: %s: %s", tool.name, type(e).__name__, e)

    def parse(
        self, text: str, parser: ToolCallParser, *, finish_reason: str = "stop", turn: int = 0
    ) -> ParsedTurn:
        """The calls in one turn's text, read by ``parser``; failures are counted by kind."""
        parsed = parser.parse(text, self.schemas, finish_reason=finish_reason, turn=turn)
        for error in parsed.errors:
            self.errors[error.error or "unknown"] += 1
        return parsed

    async def call(self, call: ToolCall) -> ToolResult:
        """Run one call; every failure becomes a ToolResult with an error kind."""
        result = await self._call(call)
        if result.error:
            self.errors[result.error] += 1
        return result

    async def _call(self, call: ToolCall) -> ToolResult:
        tool = self.tools.get(call.name)
        if tool is None:
            return ToolResult(
                call.name,
                f"Error: unknown tool {call.name!r}; available tools: {sorted(self.tools)}",
                "unknown_tool",
            )
        problem = tool.check_arguments(call.arguments)
        if problem:
            return ToolResult(call.name, f"Error: {problem}", "bad_arguments")
        try:
            async with asyncio.timeout(tool.timeout_s):
                value = await tool(call.arguments)
        except TimeoutError:
            return ToolResult(
                call.name, f"Error: {call.name} took longer than {tool.timeout_s} s", "timeout"
            )
        except Exception as e:
            return ToolResult(call.name, f"Error: {type(e).__name__}: {e}", "tool_exception")
        if isinstance(value, ToolResult):  # a tool that ran elsewhere (an env server) says
            return ToolResult(call.name, value.content, value.error)  # how it went itself
        content = value if isinstance(value, str) else json.dumps(value, default=str)
        return ToolResult(call.name, content)
