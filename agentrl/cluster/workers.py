"""Rollout workers as Ray actors (``[cluster] backend = "ray"``, ``rollout.workers > 1``).

On one machine, :class:`~agentrl.rollout.workers.WorkerRunner` starts each rollout
worker as a local process talking over two pipes
(:func:`~agentrl.rollout.worker_spawn.spawn_worker`). On a Ray cluster,
:func:`actor_spawner` gives it a ``spawn`` that starts each worker as a Ray actor
(resources ``cluster.worker_resources``, default ``{CPU = 1}``) running the same worker
code (:func:`agentrl.rollout.worker_process.serve`) over a TCP connection to this
process: the same channel, the same batched frames, so ``WorkerRunner`` drives the
actors unchanged, and the scheduler, the store and the exactly-once accounting stay
here.

The connection: this process listens on its node's IP, on a port of its choosing, for
one connection per worker; the actor connects and first sends a random 32-byte token
the spawner gave it. Anything else that connects is closed before a byte of it is
unpickled.

A dead worker actor is started again (a new actor, up to ``cluster.max_restarts`` times
in a run), and its episodes continue there from their newest checkpoints, which the
main process holds (:meth:`~agentrl.rollout.worker_messages.WorkerMessages._restart`):
the scheduler never sees the death. Once the restarts are used up, a dead worker stops
the run with an error naming it, and ``agentrl train --resume`` continues its episodes
from the store (as for a local worker process).

``ray`` is imported inside the functions: ``import agentrl.cluster.workers`` needs no Ray.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hmac
import logging
import os
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from agentrl.cluster.runtime import Placement, actor_options, call_state, join_ray
from agentrl.config import ClusterConfig, EnvConfig, ModelConfig, RolloutConfig
from agentrl.errors import InfraError
from agentrl.rollout.base import Runner
from agentrl.rollout.wire import Channel, WorkerSpec
from agentrl.rollout.worker_spawn import START_TIMEOUT_S, Worker, handshake, spawn_worker
from agentrl.rollout.workers import WorkerRunner, open_runner
from agentrl.runtime.metrics import Metrics
from agentrl.types import PartialEpisode

if TYPE_CHECKING:
    from agentrl.status import RunStatus

logger = logging.getLogger(__name__)

_TOKEN = 32
_LIMIT = 2**31
"""The stream reader's buffer limit (a message can be a long episode's checkpoint)."""

Spawn = Callable[[WorkerSpec, str, list[Worker]], Awaitable[Worker]]


class _WorkerActor:
    """The body of one rollout-worker actor."""

    def where(self) -> tuple[str, str, int]:
        """(the Ray node id, the node's IP, the pid) this worker runs on."""
        import ray

        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), os.getpid()

    def serve(self, host: str, port: int, token: bytes, event_loop: str) -> None:
        """Connect to the main process and be a rollout worker until it says stop."""
        from agentrl.rollout.worker_process import loop_factory, serve

        async def main() -> None:
            reader, writer = await asyncio.open_connection(host, port, limit=_LIMIT)
            writer.write(token)
            await serve(Channel(reader, writer))

        with asyncio.Runner(loop_factory=loop_factory(event_loop)) as runner:
            runner.run(main())


class ActorProcess:
    """A worker actor as :class:`~agentrl.rollout.workers.WorkerRunner` sees a worker
    process: a pid, :meth:`wait` and :meth:`kill`; and the node it was placed on
    (:meth:`row`: its row of status.json's "placement")."""

    def __init__(self, actor: Any, pid: int, node: str, node_ip: str = "", index: int = 0) -> None:
        self.actor = actor
        self.pid = pid
        self.node = node
        self.node_ip = node_ip
        self.index = index
        self.restarts = 0
        """How often the worker of this index was started again before this one."""
        self.serving: Any = None
        """The ``serve`` call's ObjectRef (set once it is made)."""
        self.served: concurrent.futures.Future[Any] | None = None
        """``serving.future()``, made as soon as the call is (so that it is done as soon
        as the call is): the row's state."""

    def row(self) -> dict[str, Any]:
        """Where this worker runs: "alive" while its ``serve`` call runs, then "dead" with
        why (a clean stop: "stopped")."""
        state, reason = call_state(self.served)
        return Placement(
            "worker",
            self.index,
            self.node,
            self.node_ip,
            pid=self.pid,
            state=state,
            restarts=self.restarts,
            reason=reason,
        ).as_dict()

    async def wait(self) -> int:
        """Until the worker's ``serve`` returns: 0, or 1 when the actor died or raised.
        Then the actor is removed (its resources go back to the cluster)."""
        code = 1
        try:
            if self.serving is not None:
                await self.serving
                code = 0
        except Exception as e:  # RayActorError: the actor's process is gone
            logger.debug("rollout worker actor (pid %d): %s", self.pid, type(e).__name__)
        self.kill()  # not when cancelled: then the worker may still be starting
        return code

    def kill(self) -> None:
        import ray

        ray.kill(self.actor, no_restart=True)


def _place(placed: list[ActorProcess], process: ActorProcess) -> None:
    """Add ``process``'s row; a worker started again replaces its dead one's row."""
    for i, old in enumerate(placed):
        if old.index == process.index:
            process.restarts = old.restarts + 1
            placed[i] = process
            return
    placed.append(process)


def actor_spawner(cluster: ClusterConfig, placed: list[ActorProcess] | None = None) -> Spawn:
    """A ``spawn`` for :class:`~agentrl.rollout.workers.WorkerRunner` that starts each
    rollout worker as a Ray actor (this process must have joined the cluster); each
    actor, once placed, is appended to ``placed`` (the run's placement rows)."""
    import ray

    remote = ray.remote(max_restarts=0, max_task_retries=0)(_WorkerActor)
    options = actor_options(cluster.worker_resources)

    async def spawn(spec: WorkerSpec, event_loop: str, workers: list[Worker]) -> Worker:
        host = ray.util.get_node_ip_address()
        token = secrets.token_bytes(_TOKEN)
        connected: asyncio.Future[Channel] = asyncio.get_running_loop().create_future()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                async with asyncio.timeout(30):
                    sent = await reader.readexactly(_TOKEN)
            except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                sent = b""
            if connected.done() or not hmac.compare_digest(sent, token):
                writer.close()  # not our worker (or a second connection)
                return
            connected.set_result(Channel(reader, writer))

        server = await asyncio.start_server(accept, host, 0, limit=_LIMIT)
        try:
            port = server.sockets[0].getsockname()[1]
            actor = remote.options(**options).remote()
            async with asyncio.timeout(START_TIMEOUT_S):
                node, node_ip, pid = await actor.where.remote()
            process = ActorProcess(actor, pid, node, node_ip, spec.index)
            process.serving = actor.serve.remote(host, port, token, event_loop)
            process.served = process.serving.future()
            if placed is not None:
                _place(placed, process)
            channel = await _connected(connected, process, spec.index)
        except BaseException:
            if "actor" in locals():
                ray.kill(actor, no_restart=True)
            raise
        finally:
            server.close()
        worker = Worker(spec.index, process, channel)  # type: ignore[arg-type]
        workers.append(worker)
        return await handshake(worker, spec)

    return spawn


async def _connected(
    connected: asyncio.Future[Channel], process: ActorProcess, index: int
) -> Channel:
    """The worker's channel once its actor connected back.

    Raises:
        InfraError: the actor ended first, or did not connect within ``START_TIMEOUT_S``.
    """
    ended = asyncio.ensure_future(process.wait())
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            await asyncio.wait([connected, ended], return_when=asyncio.FIRST_COMPLETED)
    except TimeoutError:
        raise InfraError(
            f"rollout worker {index} (a Ray actor, pid {process.pid}) did not connect back "
            f"within {START_TIMEOUT_S:.0f} s: can its node reach this one's IP?"
        ) from None
    finally:
        ended.cancel()
    if not connected.done():
        raise InfraError(
            f"rollout worker {index} (a Ray actor, pid {process.pid}) ended while starting "
            "(its error is in the Ray worker log); rollout.workers = 1 runs the episodes here"
        )
    return connected.result()


async def open_cluster_runner(
    stack: contextlib.AsyncExitStack,
    client: Any,
    tokenizer: Any,
    config: RolloutConfig,
    *,
    cluster: ClusterConfig,
    model: ModelConfig,
    imports: Sequence[str],
    metrics: Metrics | None = None,
    checkpoint: Callable[[PartialEpisode], Any] | None = None,
    tracer: Any = None,
    make: Callable[..., Any] | None = None,
    env: EnvConfig | None = None,
    env_handles: Sequence[Any] = (),
    status: RunStatus | None = None,
) -> Runner:
    """:func:`~agentrl.rollout.workers.open_runner`, with the workers as Ray actors when
    ``cluster.backend`` is "ray" and ``config.workers > 1`` (joining the cluster first;
    ``status``: the run's, whose placement gets a row per worker actor).

    ``env_handles``: the env servers' actors (``env.urls`` are their relays here): each
    worker actor puts relays of its own in front of them, re-aimed when one moves.
    """
    spawn, targets = spawn_worker, None
    if cluster.backend == "ray" and config.workers > 1:
        join_ray(cluster)
        placed: list[ActorProcess] = []
        if status is not None:
            status.add_placement(lambda: [p.row() for p in placed])
        spawn = actor_spawner(cluster, placed)
        if env_handles:
            targets = [h.relay.target for h in env_handles]
    runner = await open_runner(
        stack,
        client,
        tokenizer,
        config,
        model=model,
        imports=imports,
        metrics=metrics,
        checkpoint=checkpoint,
        tracer=tracer,
        make=make,
        env=env,
        env_targets=targets,
        spawn=spawn,
        restarts=cluster.max_restarts if spawn is not spawn_worker else 0,
    )
    if targets is not None and isinstance(runner, WorkerRunner):
        _follow(stack, runner, env_handles)
    return runner


def _follow(stack: contextlib.AsyncExitStack, runner: WorkerRunner, handles: Sequence[Any]) -> None:
    """Re-aim the workers' relays whenever an env server actor moves or goes down."""

    def moved() -> None:
        runner.retarget([h.relay.target for h in handles])

    for h in handles:
        h.listeners.append(moved)
        stack.callback(h.listeners.remove, moved)
