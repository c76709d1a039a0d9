"""The relay: a stable local address in front of a server that may move (real sockets)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from agentrl.cluster.proxy import RelayThread

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
