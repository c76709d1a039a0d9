"""The relay: a stable local address in front of a server that may move (real sockets)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from agentrl.runtime.relay import RelayThread

pytestmark = pytest.mark.timeout(60)


async def _server(text: str) -> AsyncIterator[tuple[str, int]]:
    app = web.Application()
    app.router.add_get("/health", lambda r: web.Response(text=text))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield "127.0.0.1", runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def _get(url: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/health") as r:
        return await r.text()


async def test_the_relay_follows_its_target_and_refuses_while_it_has_none() -> None:
    relays = RelayThread()
    try:
        relay = await relays.relay()
        assert relay.url.startswith("http://127.0.0.1:") and relay.port > 0
        with pytest.raises(aiohttp.ClientError):  # no target: the connection is closed
            await _get(relay.url)
        async for first in _server("first"):
            relay.target = first
            assert await asyncio.wait_for(_get(relay.url), 10) == "first"
        async for second in _server("second"):  # the server moved: same relay URL
            relay.target = second
            assert await asyncio.wait_for(_get(relay.url), 10) == "second"
        with pytest.raises(aiohttp.ClientError):  # its target gone: refused, not hung
            await asyncio.wait_for(_get(relay.url), 10)
    finally:
        await relays.close()


async def test_a_request_into_a_keepalive_connection_the_server_closed_is_sent_again() -> None:
    """The server answers one request per connection and closes the next one unread (as
    a keep-alive timeout does when it meets the client's next request): through the
    relay, both requests of one keep-alive client are answered."""
    connections = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        await reader.readuntil(b"\r\n\r\n")
        body = f"answer {len(connections)}".encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")  # the next request: closed, never answered
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    relays = RelayThread()
    try:
        relay = await relays.relay()
        relay.target = ("127.0.0.1", server.sockets[0].getsockname()[1])
        connector = aiohttp.TCPConnector(limit=1)  # one connection, reused
        async with aiohttp.ClientSession(connector=connector) as http:
            answers = []
            for _ in range(2):
                async with http.post(f"{relay.url}/pause") as r:  # not retried by aiohttp
                    answers.append(await r.text())
        assert answers == ["answer 1", "answer 2"]
        assert len(connections) == 2  # the second request went on a new connection
    finally:
        await relays.close()
        server.close()
