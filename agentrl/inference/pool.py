"""Several ``vllm serve`` servers behind one client: routing, health, failover, catch-up.

:class:`ServerPool` is an :class:`~agentrl.inference.base.InferenceClient` over N
servers (N = 1 is fine: it is then the retrying client for one server).

Routing
    Each episode's turns go to the same server while it is healthy (its prefix cache
    holds the conversation so far); a new episode goes to the server with the fewest
    requests in flight. The episode is the request id up to its last ``-`` (the
    runner's ids are ``{episode_id}-{n}``).

Failure
    A request whose server stops answering (connection refused or dropped, or
    ``inference.request_timeout_s``) hands back what it had sampled as an aborted
    generation, so the runner continues the turn from that exact prefix on another
    server; the dead server is taken out of the rotation. If no server is left, new
    requests wait for one to come back, up to ``inference.reconnect_timeout_s``;
    then the run stops with an :class:`~agentrl.errors.EngineError` that says so,
    with the store intact for ``agentrl train --resume``.

Health
    A background task checks ``/health`` of every server. A server that is down is
    retried with a doubling delay (0.5 s up to 8 s). A server that agentrl started
    itself and whose process died is started again (``max_restarts`` times). If that
    task (or a recovery it started) crashes, nothing watches the servers any more:
    the next ``generate`` or weight update, and requests waiting for a server, raise
    an :class:`~agentrl.errors.EngineError` caused by the crash, and so does
    :meth:`ServerPool.close` (leaving ``async with``), so the run stops with it.

Weights
    An update goes to every healthy server at once. A server that was down (or
    missed an update) gets the newest weights before it takes requests again, so
    every server in the rotation serves the pool's current version: the version a
    request is labelled with is the version of the weights that served it.

The server states, the health loop, the least-loaded choice and the wait for a server
are :class:`agentrl.serving.ServerSet`'s, shared with the env server pool; this module
adds what is vLLM's: requests, episode affinity, restarts and weight catch-up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentrl.errors import (
    ConfigError,
    EngineError,
    InfraError,
    ServerUnavailable,
    WeightSyncError,
)
from agentrl.inference.base import Generation, InferenceConfig, SamplingConfig
from agentrl.inference.server import VLLMServer, VLLMServerClient
from agentrl.serving import Member, ServerSet
from agentrl.types import RequestId

logger = logging.getLogger(__name__)

_AFFINITY_SIZE = 65536


@dataclasses.dataclass(eq=False, kw_only=True)
class _Member(Member):
    """A vLLM server in the pool: its client (and its process, if agentrl started it)."""

    client: VLLMServerClient
    server: VLLMServer | None = None
    recovering: asyncio.Task[None] | None = None
    gave_up: bool = False

    @property
    def version(self) -> int:
        """The version of the weights this server holds (its client sets it on a load)."""
        return self.client.version


@dataclasses.dataclass(frozen=True)
class PoolEvent:
    """One change of a server's state: ``down``, ``restarted``, ``up`` or ``gave_up``."""

    at: float
    url: str
    event: str
    detail: str = ""
    routed: int = 0
    """How many requests the pool had routed when it happened (an index into routes)."""


def _health_crashed(error: BaseException) -> EngineError:
    return EngineError(
        f"the server pool's health checks crashed ({type(error).__name__}: {error}; "
        "the traceback is in the log), so no server is watched or brought back. The "
        "episode store is intact: `agentrl train --resume RUN_DIR` continues the run"
    )


class _PoolRequests:
    """The pool's requests in flight: where each runs (None while it waits for a server)."""

    def __init__(self) -> None:
        self.where: dict[str, _Member | None] = {}

    def __len__(self) -> int:
        return len(self.where)

    def ids(self) -> list[str]:
        return list(self.where)

    def sampled(self, request_id: str) -> int:
        m = self.where.get(request_id)
        return m.client.requests.sampled(request_id) if m is not None else 0

    async def wait_for_tokens(self, request_id: str, n: int) -> int:
        m = self.where.get(request_id)
        if m is None:
            raise KeyError(f"request {request_id!r} is not running on a server")
        return await m.client.requests.wait_for_tokens(request_id, n)


class ServerPool:
    """An inference client over several vLLM servers (see the module docstring).

    Args:
        urls: base URLs, e.g. ``["http://127.0.0.1:8000", "http://127.0.0.1:8001"]``.
        config: deadlines and the context window (every server must match it).
        managed: servers agentrl started (by URL), restarted when their process dies.
        health_interval_s: how often ``/health`` of each server is checked.
        reconnect_timeout_s: how long requests wait when no server is healthy.
        max_restarts: how many times a managed server is started again.
    """

    def __init__(
        self,
        urls: Sequence[str],
        config: InferenceConfig | None = None,
        *,
        managed: Mapping[str, VLLMServer] | None = None,
        health_interval_s: float = 1.0,
        reconnect_timeout_s: float = 120.0,
        max_restarts: int = 3,
    ) -> None:
        if not urls:
            raise ConfigError("a server pool needs at least one server URL (inference.servers)")
        if len(set(urls)) != len(urls):
            raise ConfigError(f"inference.servers lists a server twice: {list(urls)}")
        self.config = config or InferenceConfig()
        if self.config.weight_transfer is not None:
            raise ConfigError(
                "a server pool updates weights from files; weight_transfer="
                f"{self.config.weight_transfer!r} works only with inference.mode = 'engine'"
            )
        managed = dict(managed or {})
        self.members = [
            _Member(u.rstrip("/"), client=VLLMServerClient(u, self.config), server=managed.get(u))
            for u in urls
        ]
        self._servers = ServerSet(
            self.members,
            owner="the server pool's health checks",
            error=_health_crashed,
            health_interval_s=health_interval_s,
            reconnect_timeout_s=reconnect_timeout_s,
        )
        self.max_restarts = max_restarts
        self.events: list[PoolEvent] = []
        self.failovers = 0
        """Requests that lost their server mid-generation and continued elsewhere."""
        self.routes: deque[tuple[str, str]] = deque(maxlen=100_000)
        """(request id, server URL) of the latest requests, oldest first."""
        self._routed = 0
        self._version = 0
        self._last_update: tuple[str, str] | None = None
        self._requests = _PoolRequests()
        self._aborted: set[str] = set()
        self._affinity: OrderedDict[str, _Member] = OrderedDict()
        self._update_lock = asyncio.Lock()
        self._health: asyncio.Task[None] | None = None
        self._closed = False

    async def __aenter__(self) -> ServerPool:
        self._start_health()
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close the pool; a crash of its health checks is raised here (see :meth:`close`).

        Unless the block is already leaving with an error (most likely that same crash,
        raised by a request): that error goes on, and the crash is in the log.
        """
        try:
            await self.close()
        except EngineError:
            if exc[1] is None:
                raise

    @property
    def health_interval_s(self) -> float:
        """Seconds between two rounds of ``/health`` checks (the server set's)."""
        return self._servers.health_interval_s

    @property
    def reconnect_timeout_s(self) -> float:
        """How long new work waits while no server is up (the server set's)."""
        return self._servers.reconnect_timeout_s

    # -- the InferenceClient protocol ------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len

    @property
    def requests(self) -> _PoolRequests:
        return self._requests

    async def generate(
        self, prompt_token_ids: Sequence[int], sampling: SamplingConfig, request_id: str
    ) -> Generation:
        self._raise_if_health_failed()
        self._start_health()
        if request_id in self._requests.where:
            raise ValueError(f"request id {request_id!r} is already in flight; ids must be unique")
        try:  # episode affinity: the runner's ids name their episode
            key = RequestId.parse(request_id).episode_id
        except ValueError:  # an id of someone else's making is its own key
            key = request_id
        self._requests.where[request_id] = None
        try:
            while True:
                member = await self._pick(key, request_id)
                if member is None:  # aborted while it waited for a server
                    return self._empty_abort(request_id, len(prompt_token_ids))
                self._requests.where[request_id] = member
                self.routes.append((request_id, member.url))
                self._routed += 1
                member.load += 1
                try:
                    return await member.client.generate(prompt_token_ids, sampling, request_id)
                except ServerUnavailable as e:
                    self._down(member, str(e))
                    partial = e.partial
                    if isinstance(partial, Generation) and partial.token_ids:
                        self.failovers += 1
                        return partial  # "abort": the runner continues from this prefix
                    if request_id in self._aborted:
                        return self._empty_abort(request_id, len(prompt_token_ids))
                finally:
                    member.load -= 1
                    self._requests.where[request_id] = None
        finally:
            self._requests.where.pop(request_id, None)
            self._aborted.discard(request_id)

    async def abort(self, request_id: str) -> Generation | None:
        if request_id not in self._requests.where:
            return None
        member = self._requests.where[request_id]
        if member is not None:
            return await member.client.abort(request_id)
        self._aborted.add(request_id)  # waiting for a server: generate() returns at once
        self._notify()
        return self._empty_abort(request_id, 0)

    async def reload_weights(
        self, weights_dir: str, version: int | None = None, *, keep_inflight: bool = False
    ) -> int:
        return await self._update("full", str(weights_dir), version, keep_inflight)

    async def load_lora_adapter(
        self, adapter_dir: str, version: int | None = None, *, keep_inflight: bool = False
    ) -> int:
        return await self._update("lora", str(adapter_dir), version, keep_inflight)

    async def push_weights(
        self,
        send: Callable[[], object],
        version: int | None = None,
        *,
        keep_inflight: bool = False,
    ) -> int:
        """Refused: servers load weights from files (``reload_weights``).

        Raises:
            WeightSyncError: always; pushing (NCCL) needs the in-process engine.
        """
        self._raise_if_health_failed()
        raise WeightSyncError(
            "a server pool loads weights from files; pushing them (inference."
            "weight_transfer) works only with inference.mode = 'engine'"
        )

    async def close(self) -> None:
        """Stop the health checks and close every server's client. Safe to call twice.

        Raises:
            EngineError: the health checks had crashed (the first call only; the pool
                is closed all the same).
        """
        if self._closed:
            return
        self._closed = True
        try:
            await self._servers.close()  # the health loop and the recoveries
        finally:
            for m in self.members:
                await m.client.close()

    # -- state ------------------------------------------------------------------------------

    def describe(self) -> list[dict[str, Any]]:
        """One row per server: url, up, version, requests in flight, restarts, reason."""
        return [
            {
                "url": m.url,
                "up": m.up,
                "version": m.version,
                "in_flight": m.load,
                "restarts": m.server.restarts if m.server else 0,
                "reason": m.reason,
            }
            for m in self.members
        ]

    def _ready(self) -> list[_Member]:
        return [m for m in self.members if m.up and m.version == self._version]

    def _notify(self) -> None:
        """Wake every request waiting for a server (they look at the pool again)."""
        self._servers.notify()

    def _event(self, m: _Member, event: str, detail: str = "") -> None:
        self.events.append(PoolEvent(time.time(), m.url, event, detail, self._routed))

    def _down(self, m: _Member, reason: str) -> None:
        if not m.take_down(reason):
            return
        others = len(self._ready())
        logger.warning(
            "inference server %s is down (%s); %s",
            m.url,
            reason,
            f"its episodes continue on the {others} other server(s)"
            if others
            else "no other server is up; requests wait for one to come back",
        )
        self._event(m, "down", reason)

    async def _pick(self, key: str, request_id: str) -> _Member | None:
        """The server for this episode's next request; waits while none is ready."""
        member = await self._servers.wait_for_one(
            lambda m: m.version == self._version,
            self._unavailable,
            prefer=self._affinity.get(key),
            stop=lambda: request_id in self._aborted,
        )
        if member is None:
            return None
        if self._affinity.get(key) is member:
            self._affinity.move_to_end(key)
        else:
            self._affinity[key] = member
            if len(self._affinity) > _AFFINITY_SIZE:
                self._affinity.popitem(last=False)
        return member

    def _unavailable(self) -> EngineError:
        return EngineError(
            f"no inference server answered for {self.reconnect_timeout_s:.0f} s "
            f"(inference.reconnect_timeout_s): "
            + "; ".join(f"{m.url}: {m.reason or 'catching up'}" for m in self.members)
            + ". The episode store is intact: start the servers again, then "
            "`agentrl train --resume RUN_DIR` continues where this run stopped"
        )

    async def _update(self, kind: str, path: str, version: int | None, keep: bool) -> int:
        self._raise_if_health_failed()
        self._start_health()
        async with self._update_lock:
            new_version = self._version + 1 if version is None else version
            targets = [m for m in self.members if m.up]
            results = await asyncio.gather(
                *(self._load(m.client, kind, path, new_version, keep) for m in targets),
                return_exceptions=True,
            )
            for m, result in zip(targets, results, strict=True):
                if isinstance(result, BaseException):
                    if isinstance(result, InfraError) and not await m.client.healthy():
                        self._down(m, f"weight update failed: {result}")
                        continue  # it catches up when it is back
                    raise result
            self._version = new_version
            self._last_update = (kind, path)
        self._notify()
        return new_version

    @staticmethod
    async def _load(
        client: VLLMServerClient, kind: str, path: str, version: int, keep: bool
    ) -> int:
        if kind == "full":
            return await client.reload_weights(path, version, keep_inflight=keep)
        return await client.load_lora_adapter(path, version, keep_inflight=keep)

    def _empty_abort(self, request_id: str, prompt_tokens: int) -> Generation:
        return Generation(request_id, (), (), "abort", self._version, prompt_tokens)

    # -- health -----------------------------------------------------------------------------

    def _start_health(self) -> None:
        if self._health is None and not self._closed:
            self._health = self._servers.start_health(
                lambda m: self._check(m), name="server-pool-health", check_first=True
            )

    def _raise_if_health_failed(self) -> None:
        self._servers.check()

    async def _check(self, m: _Member) -> None:
        if m.up:
            if m.server is not None and not m.server.alive:
                self._down(m, f"its process exited with code {m.server.process.returncode}")
            elif await m.client.healthy(timeout_s=5.0):
                m.failed_checks = 0
            elif m.check_failed():
                self._down(m, f"/health failed {m.failed_checks} times in a row")
            return
        busy = m.recovering is not None and not m.recovering.done()
        if not busy and not m.gave_up and m.due:
            m.recovering = self._servers.background.start(self._recover(m), name=f"recover {m.url}")

    async def _recover(self, m: _Member) -> None:
        """Bring a down server back: restart it if it is ours and dead, then catch it up."""
        try:
            if m.server is not None and not m.server.alive:
                if m.server.restarts >= self.max_restarts:
                    m.gave_up = True
                    m.reason = f"its process died and was restarted {m.server.restarts} times"
                    self._event(m, "gave_up", m.reason)
                    logger.error(
                        "inference server %s: %s; not restarting it again", m.url, m.reason
                    )
                    return
                await m.server.restart(self.config.startup_timeout_s)
                self._event(m, "restarted")
            elif not await m.client.healthy():
                raise ServerUnavailable(f"{m.url}/health does not answer", url=m.url)
            # The server may be a new process: a fresh client (no adapter names of the
            # old one), then the newest weights before it takes any request.
            fresh = VLLMServerClient(m.url, self.config)
            async with self._update_lock:
                try:
                    if self._last_update is not None:
                        kind, path = self._last_update
                        await self._load(fresh, kind, path, self._version, False)
                except BaseException:
                    await fresh.close()
                    raise
                old, m.client = m.client, fresh  # at self._version now
                m.bring_up()
            await old.close()
            self._event(m, "up", f"version {m.version}")
            logger.warning("inference server %s is back, at version %d", m.url, m.version)
            self._notify()
        except (InfraError, OSError) as e:
            m.retry_later(f"down; the last try to bring it back failed: {e}"[:500])


__all__ = ["PoolEvent", "ServerPool"]
