"""Tool schemas, tool-call parsing and ToolSet error handling: errors are messages."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.tools import Tool, ToolCall, ToolSet


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


async def slow(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: How long to sleep.
    """
    await asyncio.sleep(seconds)
    return "done"


def broken(text: str) -> str:
    """Always fails.

    Args:
        text: Ignored.
    """
    raise RuntimeError("boom")


def test_schema_from_type_hints_and_docstring() -> None:
    schema = Tool(add).schema["function"]
    assert schema["name"] == "add"
    assert schema["parameters"]["properties"]["a"] == {
        "type": "integer",
        "description": "The first number.",
    }
    with pytest.raises(TypeError, match="type hints"):
        Tool(lambda x: x)


def test_parse_several_calls_and_every_malformed_shape(tokenizer) -> None:
    from agentrl.chat.toolcalls import ToolCallFormat

    hermes = ToolCallFormat("hermes", tokenizer)  # vLLM's parser for the tiny model's format

    def parse_tool_calls(text: str):
        return hermes.parse(text, ToolSet([add]).schemas)

    text = (
        'I will add.<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 3, \\"b\\": 4}"}</tool_call>'
        "<tool_call>{not json}</tool_call>"
        '<tool_call>["add"]</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"a": 1'
    )
    parsed = parse_tool_calls(text)
    assert parsed.calls == (
        ToolCall("add", {"a": 1, "b": 2}, "t0000c000"),
        ToolCall("add", {"a": 3, "b": 4}, "t0000c001"),
    )
    assert [e.error for e in parsed.errors] == ["malformed_json", "malformed_json", "cut_off"]
    assert all(e.content.startswith("Error:") for e in parsed.errors)
    assert not parse_tool_calls("Answer: 3").has_tool_activity


async def test_toolset_turns_failures_into_messages(tokenizer) -> None:
    from agentrl.chat.toolcalls import ToolCallFormat

    tools = ToolSet([add, slow, Tool(broken)], timeout_s=0.2)
    assert (await tools.call(ToolCall("add", {"a": 2, "b": 3}))).content == "5"
    cases = [
        (ToolCall("nope", {}), "unknown_tool"),
        (ToolCall("add", {"a": "2", "b": 3}), "bad_arguments"),
        (ToolCall("add", {"a": 2}), "bad_arguments"),
        (ToolCall("add", {"a": 2, "b": 3, "c": 4}), "bad_arguments"),
        (ToolCall("add", {"a": True, "b": 3}), "bad_arguments"),
        (ToolCall("slow", {"seconds": 5.0}), "timeout"),
        (ToolCall("broken", {"text": "x"}), "tool_exception"),
    ]
    for call, kind in cases:
        result = await tools.call(call)
        assert result.error == kind, (call, result)
        assert result.content.startswith("Error:")
    tools.parse("<tool_call>oops</tool_call>", ToolCallFormat("hermes", tokenizer))
    assert tools.errors["timeout"] == 1 and tools.errors["malformed_json"] == 1
    assert tools.errors["bad_arguments"] == 4
    assert [s["function"]["name"] for s in tools.schemas] == ["add", "slow", "broken"]
    with pytest.raises(ValueError, match="two tools"):
        ToolSet([add, add])
