"""The viewer's HTTP server (aiohttp): the static page and its JSON endpoints.

Endpoints (all GET, all answers JSON; the page is ``/`` plus ``/static/*``):
``/api/runs``, ``/api/run?run=R``, ``/api/live?run=R``,
``/api/episodes?run=R&state=..&env=..&min_reward=..&max_reward=..&min_version_span=..
&failure=..&attempt=..&limit=..&offset=..``, ``/api/episode?run=R&id=E[&attempt=A]``,
``/api/features`` and ``/api/fork?job=J``; one POST, ``/api/fork`` (JSON ``{run, id,
attempt, turn}``), which starts a fork only under ``--allow-fork`` (:mod:`.forks`) and
only with the :data:`~agentrl.view.forks.FORK_HEADER` header; otherwise it is refused
with 403 and one line.

Safe by default: it binds loopback; any other host needs the token (printed in the URL,
as Jupyter does), checked on every request from the ``token`` query parameter, then
from a cookie the first good request sets. Reads happen in worker threads, so a long
episode never blocks the loop. It only reads run directories; a fork started from the
page is written by ``agentrl replay`` (a subprocess), as a new episode in the run's store.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from agentrl.errors import AgentRLError, ConfigError
from agentrl.view.data import ViewData
from agentrl.view.forks import FORK_HEADER, ForkBusy, Forks

STATIC = Path(__file__).with_name("static")
COOKIE = "agentrl_view_token"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def new_token(host: str) -> str | None:
    """A fresh token for a non-loopback host; None on loopback (no token needed)."""
    return None if is_loopback(host) else secrets.token_urlsafe(24)


def make_app(data: ViewData, token: str | None, forks: Forks | None = None) -> web.Application:
    """The viewer's application; ``token``: required on every request when not None;
    ``forks``: where forks start (None: fork requests are refused)."""
    app = web.Application(middlewares=[_token_check(token), _headers] if token else [_headers])
    app.router.add_get("/", _index)
    app.router.add_static("/static/", STATIC)
    for name, call in _endpoints(data).items():
        app.router.add_get(f"/api/{name}", _json(call))
    app.router.add_get("/api/features", _json(lambda q: {"fork": forks is not None}))
    app.router.add_get("/api/fork", _json(lambda q: _forks_on(forks).status(_required(q, "job"))))
    app.router.add_post("/api/fork", _start_fork(forks))
    return app


FORK_OFF = (
    "forking from the page is off (a fork starts an inference engine): restart the viewer "
    "with `agentrl view ROOT --allow-fork`, or run `agentrl replay RUN_DIR EPISODE --fork-at TURN`"
)


def _forks_on(forks: Forks | None) -> Forks:
    if forks is None:
        raise web.HTTPForbidden(text=FORK_OFF)
    return forks


def _start_fork(forks: Forks | None) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        if request.headers.get(FORK_HEADER) != "1":
            raise web.HTTPForbidden(
                text=f"a fork request needs the header {FORK_HEADER}: 1 (the page sends it)"
            )
        started = _forks_on(forks)
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError
        except ValueError:
            return web.json_response({"error": "send JSON {run, id, turn}"}, status=400)
        try:
            job = await started.start(body)
        except ForkBusy as e:
            return web.json_response({"error": str(e)}, status=409)
        except ConfigError as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response(job.as_dict(), status=202)

    return handler


def _endpoints(data: ViewData) -> dict[str, Callable[[Any], Any]]:
    def attempt(q: Any) -> int | None:
        raw = q.get("attempt")
        if raw in (None, ""):
            return None
        if not raw.isdigit():
            raise web.HTTPBadRequest(text=f"attempt={raw!r} is not a whole number")
        return int(raw)

    return {
        "runs": lambda q: data.runs(),
        "run": lambda q: data.run(_required(q, "run")),
        "live": lambda q: data.live(_required(q, "run")),
        "episodes": lambda q: data.episodes(_required(q, "run"), q),
        "episode": lambda q: data.episode(_required(q, "run"), _required(q, "id"), attempt(q)),
    }


def _required(query: Any, key: str) -> str:
    value = query.get(key)
    if not value:
        raise web.HTTPBadRequest(text=f"the request needs ?{key}=...")
    return str(value)


def _json(call: Callable[[Any], Any]) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        try:
            body = await asyncio.to_thread(call, request.query)
        except ConfigError as e:  # what the request named is not there, or is malformed
            return web.json_response({"error": str(e)}, status=400)
        except AgentRLError as e:  # an unreadable store: one line for the page
            return web.json_response({"error": str(e)}, status=500)
        return web.json_response(body, headers={"Cache-Control": "no-store"})

    return handler


async def _index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC / "index.html")


CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)
"""Only the page's own files run: even text that got into the page as HTML could not."""


@web.middleware
async def _headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


def _token_check(token: str) -> Any:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.query.get("token") or request.cookies.get(COOKIE) or ""
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise web.HTTPForbidden(
                text="this viewer needs its token: open the URL "
                "`agentrl view` printed (it ends in ?token=...)"
            )
        response = await handler(request)
        if request.query.get("token"):
            response.set_cookie(COOKIE, token, httponly=True, samesite="Strict")
        return response

    return check


async def serve(
    data: ViewData,
    host: str,
    port: int,
    token: str | None,
    ready: Callable[[str], None],
    *,
    allow_fork: bool = False,
) -> None:
    """Serve until cancelled; call ``ready`` with the page's URL once listening.
    ``allow_fork``: the page may start forks (each runs ``agentrl replay --fork-at``)."""
    async with asyncio.TaskGroup() as group:  # a running fork ends with the server
        forks = Forks(data, group) if allow_fork else None
        runner = web.AppRunner(make_app(data, token, forks), access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port)
            await site.start()
            bound = runner.addresses[0][1]
            shown = f"[{host}]" if ":" in host else host
            ready(f"http://{shown}:{bound}/" + (f"?token={token}" if token else ""))
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()
