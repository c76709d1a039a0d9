"""Trainer ranks as Ray actors (``[cluster] backend = "ray"``, ``trainer_ranks = N > 1``).

Without a cluster, several trainer ranks are launched by ``torchrun`` or ``accelerate
launch`` (:mod:`agentrl.trainer.distributed`): rank 0 runs the whole run, the others
:func:`~agentrl.trainer.distributed.follow_run`. On a Ray cluster the process that runs
``agentrl train`` becomes rank 0 itself: :func:`start_ranks` picks the rendezvous (this
node's IP, a free port), sets ``RANK=0`` and ``WORLD_SIZE=N`` in this process, and starts
N-1 actors (resources ``cluster.trainer_resources``, default ``{CPU = 1}``), each of
which sets its own ``RANK`` and runs the same ``follow_run`` on the same config and run
directory (gloo on CPU, NCCL on GPU, through the same
:func:`~agentrl.trainer.distributed.start_distributed`).

A rank cannot be restarted in the middle of a collective: a dead rank actor stops the
run with one error and the resume command (:class:`TrainerRanks` watches them; the run
resumes from its last checkpoint). What this module does not own: connecting to Ray
(the caller has, or :func:`connect` does), the training itself, the run.

``ray`` is imported inside the functions: ``import agentrl.cluster.ranks`` needs no Ray.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.cluster.runtime import Placement, actor_options, call_state, join_ray
from agentrl.config import RunConfig
from agentrl.errors import InfraError

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 60.0
"""How long the rank actors may take to leave after rank 0 released them."""


def free_port(host: str) -> int:
    """A TCP port on ``host`` that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rank_environment(rank: int, world: int, master_addr: str, master_port: int) -> dict[str, str]:
    """What ``torchrun`` would set for ``rank``: one rank per node as torch sees it (Ray
    gives each GPU actor its own ``CUDA_VISIBLE_DEVICES``, so its device is 0)."""
    return {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
    }


def _here() -> dict[str, Any]:
    """This process's node (Ray's id, its IP) and pid: a placement row's fields."""
    import ray

    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "pid": os.getpid(),
    }


class _Rank:
    """One trainer rank other than 0 (the body of the Ray actor)."""

    def where(self) -> dict[str, Any]:
        """The Ray node id, the node's IP and the pid this rank runs on."""
        return _here()

    def follow(self, config: RunConfig, run_dir: str, resume: bool, env: dict[str, str]) -> int:
        """Join rank 0's process group and train on what it broadcasts until it says
        stop; return the optimizer steps taken."""
        import torch

        from agentrl.trainer.distributed import follow_run, start_distributed

        os.environ.update(env)
        accelerator = start_distributed(config)
        try:
            return follow_run(config, Path(run_dir), resume=resume, accelerator=accelerator)
        finally:
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()


class TrainerRanks:
    """The rank actors of one run, as rank 0 sees them.

    Made by :func:`start_ranks`; :meth:`close` when the run ends (it waits for the ranks
    rank 0 released, then removes the actors). A rank that dies is reported once, by
    ``on_death`` (from a watcher thread) and by :meth:`check`. :meth:`placement` says
    where each rank runs (rank 0: this process), for status.json.
    """

    def __init__(
        self,
        actors: list[Any],
        refs: list[Any],
        world: int,
        on_death: Callable[[InfraError], None] | None,
    ) -> None:
        self.actors = actors
        self.world_size = world
        self.failure: InfraError | None = None
        self.steps: list[int] = []
        self._refs = refs
        self._on_death = on_death
        self._rank0 = Placement("trainer", 0, state="alive", **_here())
        self._where = [a.where.remote().future() for a in actors]
        self._follow = [r.future() for r in refs]
        self._closing = False
        self._watcher = threading.Thread(target=self._watch, name="trainer-ranks", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        import ray

        pending = list(self._refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                self.steps.append(ray.get(done[0]))
            except Exception as e:  # a rank died (RayActorError) or raised
                if self._closing:
                    return
                rank = self._refs.index(done[0]) + 1
                self.failure = InfraError(
                    f"trainer rank {rank} of {self.world_size} (a Ray actor) failed: "
                    f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; a rank "
                    "cannot rejoin in the middle of a step, so the run stops here (it resumes "
                    "from its last checkpoint)"
                )
                logger.error("%s", self.failure)
                if self._on_death is not None:
                    self._on_death(self.failure)
                return

    def check(self) -> None:
        """Raise the dead rank's failure, if one died."""
        if self.failure is not None:
            raise self.failure

    def where(self) -> list[dict[str, Any]]:
        """Node id, node IP and pid of each rank actor, rank 1 first (waits until each
        has started)."""
        return [f.result() for f in self._where]

    def placement(self) -> list[dict[str, Any]]:
        """One row per rank (status.json's "placement"): rank 0 this process, alive; a
        rank actor "starting" until it said where it runs, "alive" while its ``follow``
        runs, then "dead" with why."""
        rows = [self._rank0.as_dict()]
        calls = zip(self._where, self._follow, strict=True)
        for rank, (where, follow) in enumerate(calls, start=1):
            at = where.result() if where.done() and _succeeded(where) else {}
            state, reason = call_state(follow)
            if state == "alive" and not at:
                state = "starting"
            rows.append(Placement("trainer", rank, state=state, reason=reason, **at).as_dict())
        return rows

    def close(self, *, released: bool = True) -> None:
        """Remove the actors; when rank 0 ``released`` them (its run ended), first wait up
        to ``STOP_TIMEOUT_S`` for them to return (a rank still blocked in a collective, as
        after rank 0 failed, is killed)."""
        import ray

        if released:
            self._watcher.join(STOP_TIMEOUT_S)
        self._closing = True
        for actor in self.actors:
            ray.kill(actor, no_restart=True)


def _succeeded(call: concurrent.futures.Future[Any]) -> bool:
    return not call.cancelled() and call.exception() is None


def start_ranks(
    config: RunConfig,
    run_dir: Path,
    *,
    resume: bool,
    on_death: Callable[[InfraError], None] | None = None,
) -> TrainerRanks:
    """Make this process rank 0 of ``config.cluster.trainer_ranks`` and start the others
    as Ray actors (this process must have joined the cluster: :func:`connect`).

    Sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` here, so that
    :func:`~agentrl.trainer.distributed.launched_rank` and ``start_distributed`` then see
    a launched rank 0. The actors block in the rendezvous until rank 0 joins it.
    """
    import ray

    cluster = config.cluster
    world = cluster.trainer_ranks
    host = ray.util.get_node_ip_address()
    port = free_port(host)
    os.environ.update(rank_environment(0, world, host, port))
    # max_concurrency: `where` answers while `follow` runs
    remote = ray.remote(max_restarts=0, max_task_retries=0, max_concurrency=2)(_Rank)
    actors = [
        remote.options(name=None, **actor_options(cluster.trainer_resources)).remote()
        for _ in range(1, world)
    ]
    refs = [
        a.follow.remote(config, str(run_dir), resume, rank_environment(r, world, host, port))
        for r, a in enumerate(actors, start=1)
    ]
    logger.info(
        "trainer: rank 0 here (%s:%d), %d rank actors on the Ray cluster", host, port, world - 1
    )
    return TrainerRanks(actors, refs, world, on_death)


def cluster_ranks(
    config_path: str | None, overrides: list[str], *, resume: str | None
) -> TrainerRanks | None:
    """For ``agentrl train``: start the rank actors when the config asks for Ray and
    several trainer ranks (this process is then rank 0), else None (nothing imported).

    A rank that dies stops the run: the message and the resume command are printed, and
    this process exits (the other ranks would wait in a collective for the dead one).
    """
    from agentrl.trainer.distributed import launched_config

    if resume is not None and not (Path(resume) / "config.toml").is_file():
        return None  # not a run directory: preparing the run says so
    config = (
        RunConfig.load(Path(resume) / "config.toml", overrides)
        if resume is not None
        else RunConfig.load(config_path, overrides)
    )
    if config.cluster.backend != "ray" or config.cluster.trainer_ranks < 2:
        return None
    config, run_dir = launched_config(config_path, overrides, resume=resume)
    join_ray(config.cluster)

    def stop(failure: InfraError) -> None:
        import sys

        print(
            f"agentrl train: {failure}; continue with: agentrl train --resume {run_dir}",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)  # rank 0 may be blocked in a collective with the dead rank

    return start_ranks(config, run_dir, resume=resume is not None, on_death=stop)
