"""A small MCP server (stdio) with arithmetic tools, for the MCP example and its tests.

    python examples/mcp_tools/calc_server.py            # speaks MCP on stdin/stdout
    python examples/mcp_tools/calc_server.py --http 8200   # 127.0.0.1:8200/mcp (HTTP)

Tools: ``add(a, b)``, ``multiply(a, b)``, ``divide(a, b)`` (dividing by zero is a tool
error, ``isError``) and ``wait(seconds)`` (answers after that long: deadlines in tests).
Built on the ``mcp`` package's low-level ``Server``, so that each tool's JSON schema is
exactly the one written here. ``CALC_SERVER_LOG`` (a file path)
gets one line per call, which the tests read to see calls arrive.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server


def _pair() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "description": "The first number."},
            "b": {"type": "integer", "description": "The second number."},
        },
        "required": ["a", "b"],
    }


TOOLS = [
    types.Tool(name="add", description="Add two integers.", input_schema=_pair()),
    types.Tool(name="multiply", description="Multiply two integers.", input_schema=_pair()),
    types.Tool(
        name="divide", description="Divide a by b (integer division).", input_schema=_pair()
    ),
    types.Tool(
        name="wait",
        description="Answer after some seconds.",
        input_schema={
            "type": "object",
            "required": ["seconds"],
            "properties": {"seconds": {"type": "number"}},
        },
    ),
]


def _append(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line)


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    log = os.environ.get("CALC_SERVER_LOG")
    if log:
        _append(log, f"{os.getpid()} {params.name} {json.dumps(args)}\n")

    if params.name == "wait":
        await anyio.sleep(float(args["seconds"]))
        return types.CallToolResult(content=[types.TextContent(type="text", text="waited")])
    a, b = int(args["a"]), int(args["b"])
    if params.name == "divide" and b == 0:
        text = types.TextContent(type="text", text="division by zero")
        return types.CallToolResult(content=[text], is_error=True)
    value = {"add": a + b, "multiply": a * b, "divide": a // b if b else 0}[params.name]
    return types.CallToolResult(content=[types.TextContent(type="text", text=str(value))])


server = Server("agentrl-calc", on_list_tools=list_tools, on_call_tool=call_tool)


async def _stdio() -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", type=int, metavar="PORT", help="serve Streamable HTTP")
    args = parser.parse_args()
    if args.http:
        import uvicorn

        uvicorn.run(
            server.streamable_http_app(), host="127.0.0.1", port=args.http, log_level="warning"
        )
    else:
        anyio.run(_stdio)
