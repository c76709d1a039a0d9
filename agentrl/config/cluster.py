"""The ``[cluster]`` section: where the pieces of a run are placed.

``backend = "local"`` (the default) runs everything on this machine, as agentrl always
has, and needs no cluster library. ``backend = "ray"`` (``pip install agentrl[ray]``)
places the inference servers, env servers, rollout workers and trainer ranks on a Ray
cluster (:mod:`agentrl.cluster`, docs/guides/ray.md); the scheduler, the store and the
exactly-once accounting stay in the process that runs ``agentrl train``.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from agentrl.errors import ConfigError

ClusterBackend = Literal["local", "ray"]


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterConfig:
    """``[cluster]``: run on one machine, or place the pieces on a Ray cluster."""

    backend: ClusterBackend = "local"
    """"local": everything on this machine. "ray": place the pieces below on a Ray cluster
    (needs the ray extra: pip install agentrl[ray])."""
    address: str = "auto"
    """The Ray cluster to join: "auto" (the one `ray start` set up on this machine), an
    address such as "10.0.0.5:6379", or "local" (start a one-machine Ray for this run)."""
    inference_servers: int = 0
    """Inference servers (each a `vllm serve`) started as Ray actors behind the server
    pool; 0 keeps inference as [inference] says (in-process engine or listed servers)."""
    inference_resources: dict[str, float] = dataclasses.field(default_factory=dict)
    """Ray resources one inference server needs, e.g. {GPU = 1} or {CPU = 2}
    (default {CPU = 1})."""
    env_servers: int = 0
    """Env servers (each an `agentrl serve-env` for [env] id) started as Ray actors behind
    the remote-env pool; 0 runs envs as [env] says."""
    env_resources: dict[str, float] = dataclasses.field(default_factory=dict)
    """Ray resources one env server needs (default {CPU = 1})."""
    worker_resources: dict[str, float] = dataclasses.field(default_factory=dict)
    """Ray resources one rollout worker needs (default {CPU = 1}); rollout.workers > 1
    runs the workers as Ray actors."""
    trainer_ranks: int = 1
    """Trainer processes (torch.distributed ranks); rank 0 is the process that runs
    `agentrl train`, the others are Ray actors."""
    trainer_resources: dict[str, float] = dataclasses.field(default_factory=dict)
    """Ray resources one trainer rank other than 0 needs, e.g. {GPU = 1} (default {CPU = 1})."""
    max_restarts: int = 3
    """How many times Ray restarts a dead inference or env server actor before the pool
    gives up on it (a dead rollout-worker or trainer-rank actor stops the run resumably)."""

    def __post_init__(self) -> None:
        for name in ("inference_servers", "env_servers", "max_restarts"):
            if getattr(self, name) < 0:
                raise ConfigError(f"cluster.{name} = {getattr(self, name)!r}; it must be >= 0")
        if self.trainer_ranks < 1:
            raise ConfigError(f"cluster.trainer_ranks = {self.trainer_ranks!r}; it must be >= 1")
        for name in ("inference_resources", "env_resources", "worker_resources"):
            for key, amount in getattr(self, name).items():
                if not isinstance(amount, int | float) or amount < 0:
                    raise ConfigError(
                        f"cluster.{name}.{key} = {amount!r}; a resource amount is a number >= 0"
                    )
        for key, amount in self.trainer_resources.items():
            if not isinstance(amount, int | float) or amount < 0:
                raise ConfigError(
                    f"cluster.trainer_resources.{key} = {amount!r}; a resource amount is a "
                    f"number >= 0"
                )
        if self.backend == "local" and (
            self.inference_servers or self.env_servers or self.trainer_ranks > 1
        ):
            raise ConfigError(
                "cluster.inference_servers, env_servers and trainer_ranks place pieces on a "
                'cluster: set cluster.backend = "ray" (or leave them at 0 / 1)'
            )
