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
                upstream = await asyncio.open_connection(*target)
        except (OSError, TimeoutError):
            writer.close()
            return
        link = _Link(target, reader, writer, *upstream)
        task = asyncio.create_task(link.run(), name="relay link")
        self._pipes.add(task)
        try:
            await task
        finally:
            self._pipes.discard(task)


class _Link:
    """One relayed connection: client bytes up, server bytes down.

    A server closes an idle keep-alive connection on its own (uvicorn after 5 s). Were
    the relay slow to pass that close on, a client could send its next request into a
    connection already closed behind the relay, and see it dropped. So a request that
    follows an answered one on the same connection and meets the server's close before
    any byte of its answer is sent again on a new connection to the same server (the
    server closed the old one between requests: it never read this one).
    """

    def __init__(
        self,
        target: tuple[str, int],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        self.target = target
        self.reader, self.writer = reader, writer
        self.up_reader, self.up_writer = up_reader, up_writer
        self.unanswered = bytearray()
        """Client bytes sent up since the server's last byte down."""
        self.answered = False

    async def run(self) -> None:
        pipes = [
            asyncio.create_task(self._up(), name="relay up"),
            asyncio.create_task(self._down(), name="relay down"),
        ]
        try:
            # Either side closing ends the connection (a dead server drops its clients).
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pipes:
                task.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            for w in (self.writer, self.up_writer):
                with contextlib.suppress(OSError, RuntimeError):
                    w.close()

    async def _up(self) -> None:
        with contextlib.suppress(OSError):
            while data := await self.reader.read(_CHUNK):
                self.unanswered += data
                self.up_writer.write(data)
                with contextlib.suppress(OSError):  # a closed server: _down sends it again
                    await self.up_writer.drain()

    async def _down(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                data = await self.up_reader.read(_CHUNK)
                if data:
                    self.unanswered.clear()
                    self.answered = True
                    self.writer.write(data)
                    await self.writer.drain()
                elif not (self.answered and self.unanswered and await self._reconnect()):
                    return

    async def _reconnect(self) -> bool:
        """A new connection to the server, with the unanswered request sent on it."""
        old = self.up_writer
        try:
            async with asyncio.timeout(_CONNECT_TIMEOUT_S):
                up_reader, up_writer = await asyncio.open_connection(*self.target)
        except (OSError, TimeoutError):
            return False
        # No await from here on: _up writes its next bytes to the new connection.
        up_writer.write(bytes(self.unanswered))
        self.up_reader, self.up_writer = up_reader, up_writer
        with contextlib.suppress(OSError, RuntimeError):
            old.close()
        logger.debug(
            "relay to %s:%d: a request met a closed keep-alive connection; sent again on a new one",
            *self.target,
        )
        return True


class RelayThread:
    """The daemon thread whose event loop runs the relays; :meth:`relay` makes one."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._relays: list[Relay] = []
        self._thread = threading.Thread(target=self._loop.run_forever, name="relays", daemon=True)
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
