"""Servers as Ray actors, each behind a stable local address, watched and restarted.

:class:`ClusterServices` starts ``N`` service actors of one piece ("inference":
``vllm serve``; "env": ``agentrl serve-env``), spread over the nodes that offer the
resources the config asks for (``cluster.inference_resources`` / ``env_resources``),
each with ``max_restarts = cluster.max_restarts``. Each actor runs one server
(:class:`~agentrl.cluster.node.ServiceProcess`); the run reaches it through a
:class:`~agentrl.runtime.relay.Relay` in this process, so its URL stays the same when
Ray starts the actor again on another node or port.

A watch task pings every actor once a second and keeps its :class:`Placement` (node,
URL, state, restarts) and its relay's target up to date. What the pools see:

* an actor that died and is being restarted: its server is gone, so connections
  through its relay fail and the pools take it out (failover and stickiness are the
  pools' own). Once Ray has started it again (a new server process, perhaps on another
  node and port), the relay points there; for an inference server,
  :class:`ActorServer` (the ``managed=`` object of the
  :class:`~agentrl.inference.pool.ServerPool`) reports the old server dead and its
  ``restart()`` returns, so the pool loads the newest weights into the new one before
  it takes requests again;
* an actor Ray gave up on (restarts used up, no node left that offers its resources):
  state "dead"; the pools leave it out, and when no server of a piece is left the run
  stops with the pools' own error and the ``agentrl train --resume`` command.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.cluster.node import ServiceProcess, ServiceSpec
from agentrl.cluster.runtime import Placement, actor_options, import_ray
from agentrl.errors import EngineStartupError, ServerUnavailable
from agentrl.runtime.background import BackgroundTasks
from agentrl.runtime.relay import Relay, RelayThread

logger = logging.getLogger(__name__)

_PING_TIMEOUT_S = 5.0
_WATCH_INTERVAL_S = 1.0
_STOP_TIMEOUT_S = 15.0


class _ServiceActor(ServiceProcess):
    """The actor's body on its node: the node comes from Ray's runtime context."""

    def __init__(self, spec: ServiceSpec) -> None:
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        super().__init__(spec, lambda: (node_id, ray.util.get_node_ip_address()))


class ServiceHandle:
    """One service actor as the run sees it: the actor, its relay, its placement."""

    def __init__(self, actor: Any, relay: Relay, placement: Placement) -> None:
        self.actor = actor
        self.relay = relay
        self.placement = placement
        self.changed = asyncio.Event()  # replaced by a fresh one on every change
        self.listeners: list[Callable[[], None]] = []
        """Called after each change (the rollout workers' relays follow the server)."""

    @property
    def url(self) -> str:
        """The stable local URL the run's pools use."""
        return self.relay.url

    async def ping(self, timeout_s: float = _PING_TIMEOUT_S) -> None:
        """Ask the actor where it runs; update the placement and the relay's target."""
        ray = import_ray()
        p = self.placement
        try:
            ref = self.actor.where.remote()
            async with asyncio.timeout(timeout_s):
                where = await asyncio.wrap_future(ref.future())
        except ray.exceptions.ActorDiedError as e:
            self._set(state="dead", reason=_reason(e))
            return
        except (TimeoutError, ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            if p.state == "alive":
                self._set(state="restarting", reason="its actor does not answer")
            return
        restarted = p.pid != 0 and where["pid"] != p.pid
        self.relay.target = (where["node_ip"], int(where["url"].rsplit(":", 1)[1]))
        self._set(state="alive", reason="", restarts=p.restarts + restarted, **where)

    def _set(self, **changes: Any) -> None:
        before = self.placement.as_dict()
        for key, value in changes.items():
            setattr(self.placement, key, value)
        if self.placement.state == "dead":
            self.relay.target = None
        if self.placement.as_dict() != before:
            p = self.placement
            log = logger.info if p.state == "alive" else logger.warning
            log(
                "%s server %d: %s on node %s (%s), %d restart(s) %s",
                p.piece,
                p.index,
                p.state,
                p.node_ip,
                p.node_id[:8],
                p.restarts,
                p.reason,
            )
            self.changed.set()
            self.changed = asyncio.Event()
            for listener in self.listeners:
                listener()


def _reason(error: BaseException) -> str:
    """The useful end of a Ray error: our own error's message if it carries one."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    for marker in ("EngineStartupError: ", "ConfigError: "):
        if marker in text:
            return text.rsplit(marker, 1)[1].strip()[:2000]
    return " ".join(text.split())[-300:]


class ActorServer:
    """A service actor as the ``managed=`` server of a ServerPool (its restart is Ray's).

    ``alive`` is False from the moment the watch sees the actor dead or started again
    (a new server, without the run's weights), until :meth:`restart` has seen it back:
    the pool then catches the new server up to the newest weights.
    """

    def __init__(self, handle: ServiceHandle, give_up_at: int) -> None:
        self.handle = handle
        self.give_up_at = give_up_at
        self._pid = handle.placement.pid
        self.process = self  # the pool reads ``server.process.returncode`` for its log

    @property
    def returncode(self) -> str:
        return f"unknown (its Ray actor is {self.handle.placement.state})"

    @property
    def url(self) -> str:
        return self.handle.url

    @property
    def alive(self) -> bool:
        p = self.handle.placement
        # "restarting" may only be an actor slow to answer a ping: the pool's own health
        # checks judge the server; a new server process (pid) is what must be caught up.
        return p.state != "dead" and p.pid == self._pid

    @property
    def restarts(self) -> int:
        """Ray's restarts so far; once the actor is dead for good, enough to give up."""
        p = self.handle.placement
        return max(p.restarts, self.give_up_at) if p.state == "dead" else p.restarts

    async def restart(self, timeout_s: float = 300.0) -> None:
        """Wait for Ray to have the actor's server up again (Ray restarts it, not us)."""
        try:
            async with asyncio.timeout(timeout_s):
                while self.handle.placement.state != "alive":
                    if self.handle.placement.state == "dead":
                        raise ServerUnavailable(
                            f"inference server {self.handle.placement.index}'s Ray actor is "
                            f"dead: {self.handle.placement.reason}",
                            url=self.url,
                        )
                    await self.handle.changed.wait()
        except TimeoutError as e:
            raise ServerUnavailable(
                f"Ray did not bring inference server {self.handle.placement.index} back within "
                f"{timeout_s} s (inference.startup_timeout_s)",
                url=self.url,
            ) from e
        self._pid = self.handle.placement.pid

    async def stop(self) -> None:
        """Nothing: the actors are ended by :meth:`ClusterServices.close`."""


class ClusterServices:
    """The service actors of a run, their relays, and the task that watches them.

    Use ``async with ClusterServices(max_restarts) as services`` then :meth:`start` for
    each piece; leaving kills the actors and closes the relays.
    """

    def __init__(self, max_restarts: int) -> None:
        self.max_restarts = max_restarts
        self.handles: list[ServiceHandle] = []
        self._relays = RelayThread()
        self._background = BackgroundTasks("the cluster's service watch")

    async def __aenter__(self) -> ClusterServices:
        self._background.start(self._watch(), name="cluster-watch")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(
        self, specs: Sequence[ServiceSpec], resources: dict[str, float], timeout_s: float
    ) -> list[ServiceHandle]:
        """Start one actor per spec (spread over the nodes); return once each is healthy.

        Raises:
            EngineStartupError: a server did not come up, or no node offered
                ``resources`` within ``timeout_s``.
        """
        ray = import_ray()
        options = {
            **actor_options(resources),
            "max_restarts": self.max_restarts,
            "max_task_retries": 0,
        }
        actor_class = ray.remote(_ServiceActor)
        handles = []
        for spec in specs:
            relay = await self._relays.relay()
            actor = actor_class.options(**options).remote(spec)
            handles.append(
                ServiceHandle(actor, relay, Placement(spec.piece, spec.index, local_url=relay.url))
            )
        self.handles += handles
        results = await asyncio.gather(
            *(self._first(h, resources, timeout_s) for h in handles), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        return handles

    async def _first(
        self, handle: ServiceHandle, resources: dict[str, float], timeout_s: float
    ) -> None:
        ray = import_ray()
        p = handle.placement
        try:
            async with asyncio.timeout(timeout_s):
                where = await asyncio.wrap_future(handle.actor.where.remote().future())
        except TimeoutError as e:
            raise EngineStartupError(
                f"cluster: {p.piece} server {p.index} was not up after {timeout_s} s: no node "
                f"offered {dict(resources) or {'CPU': 1}} (cluster.{p.piece}_resources), or its "
                f"server starts slowly (its log is under the run's logs/ on its node)"
            ) from e
        except ray.exceptions.RayActorError as e:
            raise EngineStartupError(
                f"cluster: {p.piece} server {p.index} did not start: {_reason(e)}"
            ) from e
        handle.relay.target = (where["node_ip"], int(where["url"].rsplit(":", 1)[1]))
        handle._set(state="alive", **where)

    def placement(self) -> list[dict[str, Any]]:
        """One row per piece (status.json's "placement")."""
        return [h.placement.as_dict() for h in self.handles]

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(_WATCH_INTERVAL_S)
            live = [h for h in self.handles if h.placement.state not in ("dead", "starting")]
            await asyncio.gather(*(h.ping() for h in live))

    async def _stop(self, handle: ServiceHandle) -> None:
        """Ask the actor to stop its server (and what that spawned) before it is killed."""
        ray = import_ray()
        if handle.placement.state != "alive":
            return
        with contextlib.suppress(TimeoutError, ray.exceptions.RayError):
            async with asyncio.timeout(_STOP_TIMEOUT_S):
                await asyncio.wrap_future(handle.actor.stop.remote().future())

    async def close(self) -> None:
        """Stop the watch, kill the actors (their servers die with them), close the relays."""
        ray = import_ray()
        try:
            await self._background.close()
        finally:
            await asyncio.gather(*(self._stop(h) for h in self.handles))
            for h in self.handles:
                with contextlib.suppress(ray.exceptions.RayError):
                    ray.kill(h.actor, no_restart=True)
            await self._relays.close()


__all__ = ["ActorServer", "ClusterServices", "ServiceHandle"]
