"""What ``agentrl train`` calls with ``[cluster] backend = "ray"``: the services, then the run.

:func:`start_cluster` joins Ray (:func:`~agentrl.cluster.runtime.open_ray`), starts
``cluster.inference_servers`` ``vllm serve`` actors and ``cluster.env_servers``
``agentrl serve-env`` actors (:class:`~agentrl.cluster.services.ClusterServices`), all
entered in the run's exit stack, and returns the run's config with their stable URLs
in ``inference.servers`` and ``env.urls``: from there the run is the run with listed
servers (the same pools, failover and per-episode stickiness). The inference pool
gets the actors as its ``managed`` servers (:attr:`ClusterStart.managed`). The placement
goes to ``status.json`` through ``status.add_placement``.

With ``backend = "local"`` it returns the config unchanged and imports nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.cluster.node import ServiceSpec
from agentrl.cluster.runtime import cpus_needed, open_ray
from agentrl.config import RunConfig


@dataclasses.dataclass(frozen=True)
class ClusterStart:
    """What the run gets from the cluster: its config, and the inference pool's servers."""

    config: RunConfig
    """The run's config, with the services' URLs in inference.servers and env.urls."""
    managed: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The inference servers' actors by URL (the pool's ``managed=``)."""
    env_handles: tuple[Any, ...] = ()
    """The env servers' actors (:class:`~agentrl.cluster.services.ServiceHandle`), in
    ``env.urls`` order: rollout-worker actors follow them with relays of their own."""


async def start_cluster(
    cfg: RunConfig,
    run_dir: Path,
    stack: contextlib.AsyncExitStack,
    *,
    status: Any,
    say: Callable[[str], None],
) -> ClusterStart:
    """Start the run's services on the cluster (entered in ``stack``); what the run needs.

    ``status``: the run's :class:`~agentrl.status.RunStatus` (the services' rows are
    added to its placement);
    ``say``: where the progress line goes.
    """
    c = cfg.cluster
    if c.backend != "ray" or not (c.inference_servers or c.env_servers):
        return ClusterStart(cfg)
    from agentrl.cluster.services import ActorServer, ClusterServices
    from agentrl.models import resolve_model

    ray = stack.enter_context(open_ray(c, num_cpus=cpus_needed(c)))
    services = await stack.enter_async_context(ClusterServices(c.max_restarts))
    status.add_placement(services.placement)
    managed: dict[str, Any] = {}
    env_handles: list[Any] = []
    log_dir, i, env = str(Path(os.getcwd(), run_dir, "logs")), cfg.inference, cfg.env
    if c.env_servers:
        specs = [
            ServiceSpec(
                "env",
                n,
                env.reconnect_timeout_s,
                log_dir,
                os.getcwd(),
                env_id=env.id,
                env_imports=tuple(env.imports),
                env_kwargs=json.dumps(env.kwargs),
            )
            for n in range(c.env_servers)
        ]
        env_handles = await services.start(specs, c.env_resources, env.reconnect_timeout_s)
        env = dataclasses.replace(env, url="", urls=[h.url for h in env_handles], kwargs={})
    if c.inference_servers:
        model = resolve_model(cfg.model.path)
        lora = max(16, cfg.trainer.lora.r) if cfg.trainer.lora.enabled else None
        specs = [
            ServiceSpec(
                "inference",
                n,
                i.startup_timeout_s,
                log_dir,
                os.getcwd(),
                model=model,
                inference=i,
                seed=cfg.run.seed,
                max_lora_rank=lora,
            )
            for n in range(c.inference_servers)
        ]
        handles = await services.start(specs, c.inference_resources, i.startup_timeout_s)
        managed = {h.url: ActorServer(h, give_up_at=i.max_restarts) for h in handles}
        i = dataclasses.replace(i, mode="server", servers=[h.url for h in handles])
    nodes = {p["node_id"] for p in services.placement()}
    say(
        f"Ray cluster {ray.get_runtime_context().gcs_address}: {c.inference_servers} inference "
        f"and {c.env_servers} env server(s) on {len(nodes)} node(s)"
    )
    return ClusterStart(dataclasses.replace(cfg, inference=i, env=env), managed, tuple(env_handles))


__all__ = ["ClusterStart", "start_cluster"]
