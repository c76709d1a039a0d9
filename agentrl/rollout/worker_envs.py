"""A rollout worker's own way to the run's env servers (``[env] url``/``urls``).

With ``rollout.workers > 1`` and envs on env servers, every worker (a local process or
a Ray actor) opens its own :class:`~agentrl.remote.pool.EnvServerPool` of the run's env
servers, so an episode's env calls go from the worker that runs it straight to an env
server, not through the main process. The pool's health checks, failover and session
stickiness are the same as in the main process.

Servers that may move (env servers that are Ray actors, restarted by Ray on another node
and port) come with their current addresses (:attr:`EnvServers.targets`): the worker
puts a relay (:class:`~agentrl.runtime.relay.Relay`) of its own in front of each and
aims it where the main process says the server runs now. The pool knows each server by
its relay's URL, so a restart is, to the pool, a server that went down and came back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.rollout.wire import EnvServers, Target


class WorkerEnvs:
    """The env servers' pool of one worker (and its relays); :meth:`open` then :meth:`close`."""

    def __init__(self, servers: EnvServers) -> None:
        self.servers = servers
        self._relays: Any = None
        self._relay: list[Any] = []
        self._pool: Any = None

    async def open(self) -> Callable[..., Any]:
        """Start the relays (if the servers may move) and the pool; the pool's ``make``."""
        from agentrl.remote import EnvServerPool

        config = self.servers.config
        if self.servers.targets is not None:
            from agentrl.runtime.relay import RelayThread

            self._relays = RelayThread()
            self._relay = [await self._relays.relay() for _ in self.servers.targets]
            self.retarget(self.servers.targets)
            config = dataclasses.replace(config, url="", urls=[r.url for r in self._relay])
        self._pool = EnvServerPool.from_config(config)
        await self._pool.start()
        return self._pool.make

    def retarget(self, targets: Sequence[Target]) -> None:
        """Aim each relay where its server runs now (None: down, connections refused)."""
        for relay, target in zip(self._relay, targets, strict=True):
            relay.target = target

    async def close(self) -> None:
        try:
            if self._pool is not None:
                await self._pool.close()
        finally:
            if self._relays is not None:
                await self._relays.close()


__all__ = ["WorkerEnvs"]
