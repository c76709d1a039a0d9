"""The tools of an MCP server as agentrl tools: :func:`from_mcp`.

    from agentrl.tools.mcp import from_mcp

    NOTES = from_mcp([sys.executable, "notes_server.py"])   # a stdio command
    SEARCH = from_mcp("http://127.0.0.1:8200/mcp", session="shared")  # Streamable HTTP

    class MyEnv(TextEnv):
        tools = NOTES

:func:`from_mcp` asks the server for its tools once (``tools/list``), when it is
called, and gives one :class:`MCPTool` per tool, with the server's JSON schema
(``inputSchema``) as the tool's parameters, so the model sees them as it sees any
agentrl tool. Calls go through the ``mcp`` package's own ``Client`` (stdio or
Streamable HTTP). ``session="episode"`` (the default) gives each episode its own
connection (for a stdio command, its own server process), opened at the episode's
first call and closed when the episode ends; ``session="shared"`` opens one per event
loop for every episode.

Failures become the usual tool error kinds, never an exception in the runner: a result
the server marks ``isError`` is ``tool_exception`` with the server's text; a call past
its deadline is ``timeout`` (the tool's ``timeout_s``, else ``rollout.tool_timeout_s``);
a server that died or cannot be reached is ``tool_exception`` naming the server, and
the next call connects again (a stdio server is started again).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import logging
import shlex
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from agentrl.tools import Tool, ToolResult

logger = logging.getLogger(__name__)

SessionScope = Literal["episode", "shared"]
_LIST_TIMEOUT_S = 60.0


class MCPError(RuntimeError):
    """The MCP server could not be started, reached or listed (raised by :func:`from_mcp`)."""


def from_mcp(
    server: str | Sequence[str],
    *,
    session: SessionScope = "episode",
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    include: Sequence[str] | None = None,
) -> list[MCPTool]:
    """The tools of the MCP server ``server``, as agentrl tools.

    Args:
        server: an ``http://`` or ``https://`` URL (Streamable HTTP), or the command that
            starts a stdio server (a list of arguments, or one string split like a shell).
        session: ``episode`` (a connection per episode, closed at its end) or ``shared``
            (one connection per event loop for all episodes).
        timeout_s: deadline of one call; None: the run's ``rollout.tool_timeout_s``.
        env: extra environment variables for a stdio server.
        cwd: working directory of a stdio server.
        include: only these tools (by name); None: all of them.

    Raises:
        MCPError: the server did not start, answer or list its tools within 60 s, or
            ``include`` names a tool it does not have.
    """
    if session not in ("episode", "shared"):
        raise ValueError(f"from_mcp(session={session!r}): use 'episode' or 'shared'")
    target = _Target.of(server, env=env, cwd=cwd)
    try:
        listed = _run_aside(_list_tools(target), _LIST_TIMEOUT_S)
    except Exception as e:
        raise MCPError(
            f"MCP server {target} did not list its tools: {type(e).__name__}: {e}"
        ) from e
    names = [t["name"] for t in listed]
    if include is not None:
        missing = sorted(set(include) - set(names))
        if missing:
            raise MCPError(f"MCP server {target} has no tools {missing}; it has {names}")
        listed = [t for t in listed if t["name"] in include]
    shared = _Connection(target) if session == "shared" else None
    return [MCPTool(target, spec, timeout_s=timeout_s, connection=shared) for spec in listed]


class MCPTool(Tool):
    """One tool of an MCP server: its schema from ``tools/list``, its calls run there.

    With a per-episode session, :class:`~agentrl.tools.ToolSet` takes a copy bound to a
    connection of its own (:meth:`for_episode`) and closes it with :meth:`aclose`.
    """

    def __init__(
        self,
        target: _Target,
        spec: Mapping[str, Any],
        *,
        timeout_s: float | None,
        connection: _Connection | None,
    ) -> None:
        self.target = target
        self.name = str(spec["name"])
        parameters = spec.get("inputSchema") or {"type": "object", "properties": {}}
        self.schema = {
            "type": "function",
            "function": {
                "name": self.name,
                "description": spec.get("description") or "",
                "parameters": dict(parameters),
            },
        }
        self.timeout_s = timeout_s  # type: ignore[assignment]  # None: the ToolSet's deadline
        self.is_async = True
        self.fn = self._call
        self.shared = connection is not None
        self._connection = connection

    def __repr__(self) -> str:
        return f"MCPTool({self.name!r} of {self.target})"

    def for_episode(self, sessions: dict[Any, Any]) -> MCPTool:
        """This tool for one episode: itself when shared, else a copy on the episode's
        session with its server (``sessions``: the episode's, by server, shared by the
        tools of one :func:`from_mcp`)."""
        if self.shared:
            return self
        tool = copy.copy(self)
        tool._connection = sessions.setdefault(self.target, _Connection(self.target))
        return tool

    async def aclose(self) -> None:
        """Close this episode's session (nothing for a shared one)."""
        if not self.shared and self._connection is not None:
            await self._connection.close()

    async def _call(self, **arguments: Any) -> ToolResult:
        return await self(arguments)

    async def __call__(self, arguments: Mapping[str, Any]) -> ToolResult:
        if self._connection is None:  # used outside a ToolSet: a session for this call
            connection = _Connection(self.target)
            try:
                return await connection.call(self.name, dict(arguments))
            finally:
                await connection.close()
        return await self._connection.call(self.name, dict(arguments))


class _Target:
    """Where an MCP server is: a URL, or a stdio command (with its env and cwd)."""

    def __init__(
        self,
        url: str | None,
        command: list[str] | None,
        env: Mapping[str, str] | None,
        cwd: str | None,
    ) -> None:
        self.url, self.command, self.env, self.cwd = url, command, dict(env or {}), cwd

    @classmethod
    def of(
        cls, server: str | Sequence[str], *, env: Mapping[str, str] | None, cwd: str | None
    ) -> _Target:
        if isinstance(server, str) and server.startswith(("http://", "https://")):
            return cls(server, None, None, None)
        command = shlex.split(server) if isinstance(server, str) else [str(a) for a in server]
        if not command:
            raise ValueError("from_mcp: give a server URL or the command that starts it")
        return cls(None, command, env, cwd)

    def client(self) -> Any:
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters

        if self.url is not None:
            return Client(self.url)
        assert self.command is not None
        params = StdioServerParameters(
            command=self.command[0], args=self.command[1:], env=self.env or None, cwd=self.cwd
        )
        return Client(params)

    def __str__(self) -> str:
        return self.url or shlex.join(self.command or [])


class _Connection:
    """One MCP client session, held open by a task of its own on the loop that opened it
    (the ``mcp`` client's task groups must be entered and left in one task); calls from
    any task of that loop go through it. Reopened after the server goes away, and for a
    call from another event loop."""

    def __init__(self, target: _Target) -> None:
        self.target = target
        self._client: Any = None
        self._task: asyncio.Task[None] | None = None
        self._closing: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opening: asyncio.Lock | None = None

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        try:
            session = await self._open()
            result = await session.call_tool(name, arguments)
        except (asyncio.CancelledError, TimeoutError):
            raise
        except Exception as e:
            await self.close()  # the next call connects again
            return ToolResult(
                name,
                f"Error: MCP server {self.target} failed: {type(e).__name__}: {e}",
                "tool_exception",
            )
        return _tool_result(name, result)

    async def _open(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use, or a new loop: the old session is gone
            self._client, self._task, self._loop = None, None, loop
            self._opening = asyncio.Lock()
        assert self._opening is not None
        async with self._opening:
            if self._task is not None and self._task.done():
                self._client = self._task = None
            if self._client is None:
                ready: asyncio.Future[Any] = loop.create_future()
                self._closing = asyncio.Event()
                self._task = loop.create_task(
                    self._hold(ready, self._closing), name=f"agentrl-mcp {self.target}"
                )
                self._client = await ready
        return self._client

    async def _hold(self, ready: asyncio.Future[Any], closing: asyncio.Event) -> None:
        try:
            async with self.target.client() as session:
                ready.set_result(session)
                await closing.wait()
        except BaseException as e:
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else RuntimeError(repr(e)))
            if isinstance(e, asyncio.CancelledError):
                raise
            logger.debug("MCP session with %s ended: %r", self.target, e)

    async def close(self) -> None:
        """End the session (a stdio server process ends with it)."""
        task, closing = self._task, self._closing
        self._client = self._task = None
        if task is None or task.done() or closing is None:
            return
        if self._loop is not asyncio.get_running_loop():
            return  # its loop ended, and the session with it
        closing.set()
        # _hold ends on its own (it logs how); a cancellation of the closer goes on from here
        await asyncio.wait([task], timeout=10)
        if not task.done():
            task.cancel()


def _tool_result(name: str, result: Any) -> ToolResult:
    """A ``CallToolResult`` as agentrl's :class:`ToolResult` (text content joined)."""
    parts = []
    for block in getattr(result, "content", None) or []:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else block.model_dump_json(exclude_none=True))
    structured = getattr(result, "structuredContent", None) or getattr(
        result, "structured_content", None
    )
    if not parts and structured is not None:
        import json

        parts.append(json.dumps(structured, default=str))
    content = "\n".join(parts)
    if getattr(result, "isError", None) or getattr(result, "is_error", None):
        return ToolResult(name, f"Error: {content}", "tool_exception")
    return ToolResult(name, content)


async def _list_tools(target: _Target) -> list[dict[str, Any]]:
    async with target.client() as session:
        listed = await session.list_tools()
    return [tool.model_dump(by_alias=True, exclude_none=True) for tool in listed.tools]


def _run_aside(coro: Any, timeout_s: float) -> Any:
    """Run ``coro`` to the end on an event loop of its own, in a thread (callable from
    inside a running loop too)."""

    async def bounded() -> Any:
        async with asyncio.timeout(timeout_s):
            return await coro

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agentrl-mcp") as pool:
        return pool.submit(asyncio.run, bounded()).result()
