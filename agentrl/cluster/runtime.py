"""Joining Ray, and the record of where each piece runs.

:func:`open_ray` connects this process to the cluster ``cluster.address`` names
("auto": the one ``ray start`` set up on this machine; "HOST:PORT": that cluster;
"local": a one-machine Ray started for this run, its dashboard off, bound to 127.0.0.1)
and, on leaving, shuts down only what it started. A process already connected (a test
that built its own cluster) is used as it is.

:class:`Placement` is one piece's row in ``status.json`` ("placement"): the piece, its
index, the node it runs on (id and IP), its server's URL there, its state (``starting``,
``alive``, ``restarting``, ``dead``) and how often Ray restarted it. :func:`call_state`
is the state of a piece that lives in one actor call (a rollout worker's ``serve``, a
trainer rank's ``follow``).

Ray is imported only here and in the modules beside this one, when a run asks for it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from agentrl.config.cluster import ClusterConfig
from agentrl.errors import ConfigError

logger = logging.getLogger(__name__)

RAY_MISSING = 'cluster.backend = "ray" needs the ray extra: pip install agentrl[ray]'
PieceState = Literal["starting", "alive", "restarting", "dead"]


def import_ray(*, loopback: bool = False) -> Any:
    """The ``ray`` module, or a :class:`ConfigError` saying how to install it.

    ``loopback``: keep a Ray started by this process on 127.0.0.1 (Ray reads this
    setting when it is first imported).
    """
    if loopback:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError as e:
        raise ConfigError(RAY_MISSING) from e
    return ray


@contextlib.contextmanager
def open_ray(cluster: ClusterConfig, *, num_cpus: int | None = None) -> Iterator[Any]:
    """Connect to the cluster ``cluster.address`` names; yield the ``ray`` module; shut
    Ray down on leaving if this call connected.

    ``num_cpus``: with address "local", the CPUs the one-machine Ray offers (at least
    this machine's); ignored when joining a cluster.
    """
    ray = import_ray(loopback=cluster.address == "local")
    if ray.is_initialized():
        yield ray
        return
    join_ray(cluster, num_cpus=num_cpus)
    try:
        yield ray
    finally:
        ray.shutdown()


def join_ray(cluster: ClusterConfig, *, num_cpus: int | None = None) -> Any:
    """Connect this process to ``cluster.address`` (start a one-machine Ray on 127.0.0.1
    for "local"), unless it is connected already; the ``ray`` module. Ray is shut down
    when the process exits.

    Raises:
        ConfigError: no Ray cluster answers at ``cluster.address``.
    """
    local = cluster.address == "local"
    ray = import_ray(loopback=local)
    if ray.is_initialized():
        return ray
    if local:
        ray.init(
            address="local",
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            num_cpus=max(os.cpu_count() or 1, num_cpus or 0),
            log_to_driver=False,
            configure_logging=False,
        )
        return ray
    try:
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    except ConnectionError as e:
        raise ConfigError(
            f"cluster.address = {cluster.address!r}: no Ray cluster answers there ({e}); "
            'start one (`ray start --head`) or set cluster.address = "local"'
        ) from e
    return ray


def actor_options(resources: Mapping[str, float]) -> dict[str, Any]:
    """Ray's ``.options()`` for a piece that needs ``resources`` (a ``cluster.*_resources``
    table; ``{CPU = 1}`` when empty): ``CPU`` and ``GPU`` become ``num_cpus`` and
    ``num_gpus``, the rest custom resources. Pieces of a kind are spread over the nodes
    that offer them (Ray's default packs them onto one node: their work and their
    failure would then land on one machine)."""
    table = dict(resources) or {"CPU": 1.0}
    options: dict[str, Any] = {
        "num_cpus": float(table.pop("CPU", 0.0)),
        "num_gpus": float(table.pop("GPU", 0.0)),
        "scheduling_strategy": "SPREAD",
    }
    if table:
        options["resources"] = {k: float(v) for k, v in table.items()}
    return options


def cpus_needed(cluster: ClusterConfig) -> int:
    """The CPUs the services of ``cluster`` ask for in all (for a one-machine Ray)."""
    inference = actor_options(cluster.inference_resources)["num_cpus"]
    env = actor_options(cluster.env_resources)["num_cpus"]
    return int(cluster.inference_servers * inference + cluster.env_servers * env + 0.999)


@dataclasses.dataclass(slots=True)
class Placement:
    """Where one piece of the run is: one row of ``status.json``'s "placement"."""

    piece: str
    """"inference", "env", "worker" (a rollout worker) or "trainer" (a trainer rank)."""
    index: int
    node_id: str = ""
    node_ip: str = ""
    url: str = ""
    """The piece's server on its node (the run reaches it through ``local_url``)."""
    local_url: str = ""
    """The stable address the run's pools use (a relay in this process)."""
    pid: int = 0
    """The server process on its node."""
    state: PieceState = "starting"
    restarts: int = 0
    """How often Ray started the piece again after it died."""
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def call_state(call: concurrent.futures.Future[Any] | None) -> tuple[PieceState, str]:
    """(state, reason) of a piece that lives as long as one call of its actor (``call``:
    the call's ObjectRef ``.future()``; None: not made yet): "starting", then "alive"
    while the call runs, "dead" once it returned ("stopped") or failed (why, in a line)."""
    if call is None:
        return "starting", ""
    if not call.done():
        return "alive", ""
    if call.cancelled():
        return "dead", "cancelled"
    error = call.exception()
    if error is None:
        return "dead", "stopped"
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return "dead", f"{type(error).__name__}: {first}"[:200].rstrip(": ")


__all__ = [
    "RAY_MISSING",
    "Placement",
    "actor_options",
    "call_state",
    "import_ray",
    "join_ray",
    "open_ray",
]
