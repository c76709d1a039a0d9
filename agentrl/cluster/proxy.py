"""A stable local address for a server that may move: a TCP relay in a thread.

A Ray actor that dies is started again by Ray, possibly on another node and always on a
new port, but the run's pools (:class:`~agentrl.inference.pool.ServerPool`,
:class:`~agentrl.remote.pool.EnvServerPool`) know a server by its URL. :class:`Relay`
listens on 127.0.0.1 and a free port in this process and copies each connection's bytes
both ways to wherever the server runs now (:attr:`Relay.target`, set by whoever watches
the actor). While the server is down (no target, or it refuses), a connection is closed
at once, which the pools see as a server that stopped answering: they fail over, and
take it back when ``/health`` answers through the relay again.

All relays run on one event loop in one daemon thread (:class:`RelayThread`), so the
bytes of the token streams do not pass through the run's own event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")
_CONNECT_TIMEOUT_S = 5.0
_CHUNK = 65536


class Relay:
    """One listening socket on 127.0.0.1 relaying to :attr:`target` (host, port) or nothing."""

    def __init__(self) -> None:
        self.target: tuple[str, int] | None = None
        """Where connections go now; None: refuse them (the server is down)."""
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        target = self.target
        if target is None:
            writer.close()
            return
        try:
            async with asyncio.timeout(_CONNECT_TIMEOUT_S):
                up_reader, up_writer = await asyncio.open_connection(*target)
        except (OSError, TimeoutError):
            writer.close()
            return
        pipes = [
            asyncio.create_task(_pipe(reader, up_writer), name="relay up"),
            asyncio.create_task(_pipe(up_reader, writer), name="relay down"),
        ]
        self._pipes.update(pipes)
        try:
            # Either side closing ends the connection (a dead server drops its clients).
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pipes:
                task.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            self._pipes.difference_update(pipes)
            for w in (writer, up_writer):
                with contextlib.suppress(OSError, RuntimeError):
                    w.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()


class RelayThread:
    """The daemon thread whose event loop runs the relays; :meth:`relay` makes one."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._relays: list[Relay] = []
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="cluster-relays", daemon=True
        )
        self._thread.start()

    def _call(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def relay(self) -> Relay:
        """A new relay, listening (no target yet)."""
        relay = Relay()
        await asyncio.wrap_future(self._call(relay.start()))
        self._relays.append(relay)
        return relay

    async def close(self) -> None:
        """Close every relay and stop the thread."""
        for relay in self._relays:
            await asyncio.wrap_future(self._call(relay.close()))
        self._loop.call_soon_threadsafe(self._loop.stop)
        await asyncio.to_thread(self._thread.join, 10.0)
        if not self._thread.is_alive():
            self._loop.close()


__all__ = ["Relay", "RelayThread"]
