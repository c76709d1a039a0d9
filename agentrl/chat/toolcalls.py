"""Tool-call formats of model families, read by vLLM's maintained tool parsers.

A model writes its tool calls in its family's format: Qwen2.5/Qwen3 and Hermes put JSON
in ``<tool_call>`` tags, Llama 3.1-3.3 write bare JSON (``{"name": ..., "parameters":
...}``, optionally after ``<|python_tag|>``), Mistral writes ``[TOOL_CALLS] [...]``,
OLMo 3 and Llama 3.2/4 (pythonic templates) write Python calls. agentrl does not parse
any of them itself: :class:`ToolCallFormat` hands a turn's text to the parser vLLM ships
for the format (``vllm.tool_parsers.ToolParserManager``, the names of ``vllm serve
--tool-call-parser``), which takes the tokenizer and reads a finished text.

What agentrl adds around the parser, for every family alike:

* failure kinds: a maintained parser that cannot read a call returns the text as plain
  content. When that text holds the format's call marker, the turn *tried* to call a
  tool, and the failure is counted: ``cut_off`` when the turn hit its token limit (or a
  call's closing tag is missing), else ``malformed_json`` (kept as the name of every
  syntax error, JSON or Python). Formats with one marker per call are then read call by
  call, so one broken call does not hide the good ones. ``unknown_tool`` and
  ``bad_arguments`` are found later, when :class:`~agentrl.tools.ToolSet` runs the call;
* deterministic call ids (``t0002c001``, 9 characters as Mistral requires), so a turn
  renders the same way when an episode is replayed;
* how results go back (:meth:`ToolCallFormat.result_messages`): tool messages, with the
  call id where the family's template needs one.

In: a tokenizer and a format name (see :func:`detect_tool_format` for ``auto``). Out:
:class:`~agentrl.tools.ParsedTurn`. Imports vLLM when a format is built, not before.
"""

from __future__ import annotations

import ast
import contextvars
import dataclasses
import functools
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from agentrl.tools import ParsedTurn, ToolCall, ToolResult
from agentrl.types import Message

Syntax = Literal["json", "python", "xml"]


@dataclasses.dataclass(frozen=True, slots=True)
class ToolFormat:
    """What agentrl knows of one format beyond its parser: how a call looks from outside."""

    name: str
    """The vLLM tool-parser name (``vllm serve --tool-call-parser NAME``)."""
    families: str
    """Model families that write it (for reports and the model-families table of the docs)."""
    syntax: Syntax
    shape: str
    """What one call must look like, for the error message the model reads."""
    markers: tuple[str, ...] = ()
    """Any of these in a turn means it tried to call a tool."""
    bare_start: tuple[str, ...] = ()
    """A turn that starts with one of these tried to call a tool (formats with no tag)."""
    closes: str | None = None
    """Closes one call; a call without it was cut off."""
    per_call: bool = False
    """Every call opens with ``markers[0]`` (the turn can be read call by call)."""
    signature: tuple[str, ...] = ()
    """A chat template holding all of these renders calls in this format."""
    history_tool_calls: bool = False
    """The template renders calls from ``tool_calls`` on the assistant message and every
    tool result must name its call (Mistral): a call that could not be read gets a
    stand-in call (no arguments) so that its error goes back as a tool result too."""


FORMATS: dict[str, ToolFormat] = {
    f.name: f
    for f in (
        ToolFormat(
            "hermes",
            "Qwen2.5, Qwen3, QwQ, Hermes 2/3 (and agentrl's tiny model)",
            "json",
            '{"name": string, "arguments": object}',
            markers=("<tool_call>",),
            closes="</tool_call>",
            per_call=True,
            signature=("<tool_call>",),
        ),
        ToolFormat(
            "qwen3_coder",
            "Qwen3-Coder, Qwen3.5 (XML parameters)",
            "xml",
            "<function=NAME><parameter=KEY>VALUE</parameter></function>",
            markers=("<tool_call>", "<function="),
            closes="</tool_call>",
            per_call=True,
            signature=("<function=", "<parameter="),
        ),
        ToolFormat(
            "llama3_json",
            "Llama 3.1, 3.2, 3.3 (JSON tool calls)",
            "json",
            '{"name": string, "parameters": object}',
            markers=("<|python_tag|>",),
            bare_start=("{",),
            signature=("<|start_header_id|>", '"parameters"'),
        ),
        ToolFormat(
            "mistral",
            "Mistral 7B v0.3, Nemo, Small (pre-v11 tokenizers)",
            "json",
            '[TOOL_CALLS] [{"name": string, "arguments": object}, ...]',
            markers=("[TOOL_CALLS]",),
            signature=("[TOOL_CALLS]",),
            history_tool_calls=True,
        ),
        ToolFormat(
            "olmo3",
            "OLMo 3 (pythonic calls in <function_calls>)",
            "python",
            "<function_calls>\nname(key=value, ...)\n</function_calls>",
            markers=("<function_calls>",),
            closes="</function_calls>",
            signature=("<function_calls>",),
        ),
        ToolFormat(
            "llama4_pythonic",
            "Llama 4 (pythonic template)",
            "python",
            "[name(key=value, ...), ...]",
            markers=("<|python_start|>",),
            bare_start=("[",),
            signature=("<|python_start|>",),
        ),
        ToolFormat(
            "pythonic",
            "Llama 3.2 pythonic template, ToolACE, other small models",
            "python",
            "[name(key=value, ...), ...]",
            bare_start=("[",),
            signature=("[func_name1(",),
        ),
    )
}
"""The formats agentrl knows how a call looks from outside; any other vLLM parser name
works too, without the per-call reading and the cut-off check by closing tag."""

# Most specific first: Qwen3-Coder templates also hold "<tool_call>", Llama 4 pythonic
# templates "<|start_header_id|>"-like headers.
_DETECTION_ORDER = (
    "mistral",
    "qwen3_coder",
    "llama4_pythonic",
    "olmo3",
    "pythonic",
    "hermes",
    "llama3_json",
)


def detect_tool_format(template: str | None) -> str | None:
    """The tool-call format a chat template renders, or None when it shows none."""
    if not template:
        return None
    for name in _DETECTION_ORDER:
        if all(s in template for s in FORMATS[name].signature):
            return name
    return None


def available_tool_formats() -> list[str]:
    """Every tool-parser name vLLM registers (importing vLLM's parser registry)."""
    from vllm.tool_parsers import ToolParserManager

    return ToolParserManager.list_registered()


class ToolCallFormat:
    """Reads tool calls in one format with vLLM's parser; implements ``ToolCallParser``.

    Args:
        name: a vLLM tool-parser name (``hermes``, ``llama3_json``, ``mistral``, ...).
        tokenizer: the model's tokenizer (vLLM's parsers look their markers up in it).

    Raises:
        KeyError: vLLM has no parser of that name.
        RuntimeError: the parser refused the tokenizer (e.g. its marker is not a token).
    """

    def __init__(self, name: str, tokenizer: Any) -> None:
        from vllm.tool_parsers import ToolParserManager

        self.name = name
        self.spec = FORMATS.get(name) or ToolFormat(name, "(a vLLM parser)", "json", "a call")
        self._parser = ToolParserManager.get_tool_parser(name)(tokenizer)
        _quiet_while_parsing(self._parser)

    def __repr__(self) -> str:
        return f"ToolCallFormat({self.name!r})"

    def parse(
        self,
        text: str,
        tools: Sequence[Mapping[str, Any]],
        *,
        finish_reason: str = "stop",
        turn: int = 0,
    ) -> ParsedTurn:
        """The calls in one turn's text and what could not be read (see the module doc)."""
        if not self.attempted(text):
            return ParsedTurn((), ())
        request = _request(json.dumps(list(tools), sort_keys=True))
        calls, errors = self._read(text, request, finish_reason, last=True)
        if not calls and self.spec.per_call and text.count(self.spec.markers[0]) > 1:
            calls, errors = [], []
            pieces = text.split(self.spec.markers[0])[1:]
            for i, piece in enumerate(pieces):
                got, bad = self._read(
                    self.spec.markers[0] + piece, request, finish_reason, last=i == len(pieces) - 1
                )
                calls += got
                errors += bad
        ids = [f"t{turn:04d}c{i:03d}" for i in range(len(calls))]
        numbered = tuple(
            ToolCall(c.name, c.arguments, id_) for c, id_ in zip(calls, ids, strict=True)
        )
        return ParsedTurn(numbered, tuple(errors))

    def attempted(self, text: str) -> bool:
        """Whether ``text`` tried to call a tool (holds the format's call marker)."""
        if any(m in text for m in self.spec.markers):
            return True
        head = text.lstrip()
        if not head.startswith(self.spec.bare_start) or not self.spec.bare_start:
            return False
        return self.spec.syntax != "python" or "(" in head

    def _read(
        self, text: str, request: Any, finish_reason: str, last: bool
    ) -> tuple[list[ToolCall], list[ToolResult]]:
        token = _PARSING.set(True)
        try:
            info = self._parser.extract_tool_calls(text, request)
        except Exception:  # a parser bug on odd text is the model's malformed call
            info = None
        finally:
            _PARSING.reset(token)
        if info is None or not info.tools_called or not info.tool_calls:
            return [], [self._failure(text, finish_reason if last else "stop")]
        calls: list[ToolCall] = []
        errors: list[ToolResult] = []
        for tc in info.tool_calls:
            name, arguments = tc.function.name, _arguments(tc.function.arguments)
            if not name or arguments is None:
                errors.append(
                    ToolResult(
                        name or "",
                        f"Error: a tool call must be "
                        f"{self.spec.shape}, got {tc.function.arguments[:200]!r} as "
                        f"the arguments of {name!r}",
                        "malformed_json",
                    )
                )
            else:
                calls.append(ToolCall(name, arguments))
        return calls, errors

    def _failure(self, text: str, finish_reason: str) -> ToolResult:
        spec = self.spec
        opened = max((text.rfind(m) for m in spec.markers), default=-1)
        unclosed = spec.closes is not None and opened > text.rfind(spec.closes)
        if finish_reason == "length" or unclosed:
            where = f"before {spec.closes}" if spec.closes else "by the turn's token limit"
            return ToolResult("", f"Error: the tool call was cut off {where}", "cut_off")
        return ToolResult("", _syntax_error(spec, _body(spec, text)), "malformed_json")

    def result_messages(
        self, parsed: ParsedTurn, results: Sequence[ToolResult], turn: int
    ) -> list[Message]:
        """The tool messages that take a turn's results back, in ``results`` order (the
        calls, then the errors of calls that could not be read), each with the id of its
        call where the family's template needs one."""
        ids = [c.id for c in parsed.calls] + _stand_in_ids(turn, len(parsed.errors))
        messages: list[Message] = []
        for id_, result in zip(ids, results, strict=True):
            message: Message = {"role": "tool", "name": result.name, "content": result.content}
            if self.spec.history_tool_calls:
                message["tool_call_id"] = id_
            messages.append(message)
        return messages

    def history_calls(self, parsed: ParsedTurn, turn: int) -> list[dict[str, Any]] | None:
        """``tool_calls`` for the assistant message, for templates that render them (a
        call that could not be read appears as a stand-in without arguments)."""
        if not self.spec.history_tool_calls:
            return None
        calls = [(c.id, c.name, dict(c.arguments)) for c in parsed.calls]
        stand_ins = _stand_in_ids(turn, len(parsed.errors))
        calls += [(id_, e.name, {}) for id_, e in zip(stand_ins, parsed.errors, strict=True)]
        return [
            {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}
            for id_, name, args in calls
        ]


def _stand_in_ids(turn: int, count: int) -> list[str]:
    return [f"t{turn:04d}e{i:03d}" for i in range(count)]


def _arguments(raw: str) -> dict[str, Any] | None:
    """Arguments as vLLM hands them on (a JSON string); some models nest a JSON string."""
    value: Any = raw
    for _ in range(2):
        if not isinstance(value, str):
            break
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return value if isinstance(value, dict) else None


def _body(spec: ToolFormat, text: str) -> str:
    """The call's text without its tags, for the error message."""
    start = max((text.find(m) + len(m) for m in spec.markers if m in text), default=0)
    body = text[start:] if start else text.lstrip()
    if spec.closes and spec.closes in body:
        body = body[: body.index(spec.closes)]
    return body.strip()


def _syntax_error(spec: ToolFormat, body: str) -> str:
    """Why ``body`` is not a call, in words for the model."""
    shown = repr(body[:200])
    if spec.syntax == "json":
        try:
            json.loads(body)
        except json.JSONDecodeError as e:
            return f"Error: tool call is not valid JSON ({e.msg}): {shown}"
    elif spec.syntax == "python":
        try:
            ast.parse(body)
        except SyntaxError as e:
            return f"Error: tool call is not valid Python ({e.msg}): {shown}"
    return f"Error: a tool call must be {spec.shape}, got {shown}"


@functools.lru_cache(maxsize=64)
def _request(tools_json: str) -> Any:
    """The chat request vLLM's parsers read the tool schemas from (built once per set)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    tools = json.loads(tools_json)
    return ChatCompletionRequest(
        messages=[{"role": "user", "content": ""}], model="agentrl", tools=tools or None
    )


# vLLM's parsers log every call they cannot read with a traceback (right for a server,
# where it is rare); in RL a malformed call is data, counted and shown to the model. The
# filter drops those records only while agentrl parses.
_PARSING: contextvars.ContextVar[bool] = contextvars.ContextVar("agentrl_parsing", default=False)


class _WhileParsing(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _PARSING.get()


_FILTER = _WhileParsing()


def _quiet_while_parsing(parser: Any) -> None:
    """Filter the loggers of the parser's modules (and of the engine it may wrap)."""
    parts = [parser, *(v for v in vars(parser).values() if type(v).__module__.startswith("vllm."))]
    for cls in {c for part in parts for c in type(part).__mro__}:
        if cls.__module__.startswith("vllm."):
            logger = logging.getLogger(cls.__module__)
            if _FILTER not in logger.filters:
                logger.addFilter(_FILTER)
