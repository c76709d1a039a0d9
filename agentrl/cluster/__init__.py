"""The Ray backend: the pieces of a run placed on a Ray cluster (``[cluster] backend = "ray"``).

The core never imports Ray; only this package does, and only inside its functions, so
``import agentrl`` and a run on one machine need no Ray. What lives here:

* :mod:`agentrl.cluster.runtime`: join (or start) Ray from ``cluster.address``, shut
  down what this run started; the placement record (which piece runs on which node)
  that ``status.json``, ``agentrl top`` and the live display show.
* :mod:`agentrl.cluster.services`: inference servers (``vllm serve``) and env servers
  (``agentrl serve-env``) as Ray actors, each behind a stable local address, restarted
  by Ray when they die, each behind a stable local address (a relay,
  :mod:`agentrl.runtime.relay`, to wherever the actor's server runs now).
* :mod:`agentrl.cluster.start`: what ``agentrl train`` calls: start the services and hand
  their URLs to the run as if ``inference.servers`` / ``env.urls`` listed them.
* :mod:`agentrl.cluster.ranks`: trainer ranks other than 0 as Ray actors (the process
  that runs ``agentrl train`` is rank 0).
* :mod:`agentrl.cluster.workers`: rollout workers as Ray actors, driven over TCP by the
  same ``WorkerRunner`` that drives local worker processes.

The scheduler, the episode store and the exactly-once accounting stay in the process
that runs ``agentrl train``. docs/guides/ray.md is the user's guide.
"""

from __future__ import annotations

__all__: list[str] = []
