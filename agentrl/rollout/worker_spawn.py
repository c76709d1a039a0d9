"""Starting one rollout worker process, from the main process (``rollout.workers > 1``).

:func:`spawn_worker` starts ``python -P -m agentrl.rollout.worker_process`` with two
pipes, sends it its :class:`~agentrl.rollout.wire.WorkerSpec` and waits until it has
built its runner (``START_TIMEOUT_S``). What runs in the worker is
:mod:`agentrl.rollout.worker_process`; what drives it afterwards,
:class:`~agentrl.rollout.workers.WorkerRunner`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from pathlib import Path

from agentrl.errors import InfraError
from agentrl.rollout.wire import Channel, WorkerSpec

START_TIMEOUT_S = 300.0
"""How long a worker may take to start (import, tokenizer, env modules)."""


@dataclasses.dataclass
class Worker:
    """One started worker process, as the main process sees it."""

    index: int
    process: asyncio.subprocess.Process
    channel: Channel
    running: dict[int, str] = dataclasses.field(default_factory=dict)
    """Episode ids by dispatch key."""
    reader: asyncio.Task[None] | None = None
    cpu_s: float = 0.0
    """CPU seconds the worker spent between ready and stopped (while it runs: minus the
    reading at ready)."""
    event_loop: str = ""
    """The class of the worker's event loop (``uvloop.Loop``, ...)."""


def worker_env() -> dict[str, str]:
    """The environment of a worker: this one, with this process's ``agentrl`` first on the
    path. The wire and the pickled objects are this version's; ``-P`` keeps the current
    directory (another checkout, say) from putting a different ``agentrl`` first."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, path] if path else [root])}


async def spawn_worker(spec: WorkerSpec, event_loop: str, workers: list[Worker]) -> Worker:
    """Start worker ``spec.index`` and wait until it is ready.

    The worker is appended to ``workers`` as soon as its process exists, so whoever
    owns the list stops it even when starting fails.

    Raises:
        InfraError: the worker exited, or did not start within ``START_TIMEOUT_S``.
    """
    index = spec.index
    down_r, down_w = os.pipe()  # main -> worker
    up_r, up_w = os.pipe()  # worker -> main
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-P",
            "-m",
            "agentrl.rollout.worker_process",
            str(down_r),
            str(up_w),
            event_loop,
            pass_fds=(down_r, up_w),
            stdin=asyncio.subprocess.DEVNULL,
            env=worker_env(),
            start_new_session=True,  # Ctrl-C reaches this process, which stops them
        )
    finally:
        os.close(down_r)
        os.close(up_w)
    worker = Worker(index, process, await Channel.open(up_r, down_w))
    workers.append(worker)
    return await handshake(worker, spec)


async def handshake(worker: Worker, spec: WorkerSpec) -> Worker:
    """Send a started worker its spec and wait until it is ready (also for workers
    started elsewhere: :mod:`agentrl.cluster.workers`).

    Raises:
        InfraError: the worker exited, or did not start within ``START_TIMEOUT_S``.
    """
    index, process, channel = spec.index, worker.process, worker.channel
    channel.send(("init", spec))
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            message = await channel.recv()
    except (asyncio.IncompleteReadError, ConnectionError):
        code = await process.wait()
        raise InfraError(
            f"rollout worker {index} exited with code {code} while starting (its error is "
            "printed above); rollout.workers = 1 runs the episodes in this process"
        ) from None
    except TimeoutError:
        raise InfraError(
            f"rollout worker {index} did not start within {START_TIMEOUT_S:.0f} s"
        ) from None
    assert message[0] == "ready", message
    worker.cpu_s, worker.event_loop = -message[2], message[3]
    return worker
