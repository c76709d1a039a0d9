"""``EpisodeStore``: the durable record of a run, on SQLite in WAL mode.

The store is the source of truth. It holds:

* ``runs``: each start of the run (the first and every ``--resume``) with its config;
* ``tasks``: every task with its group size and state (``pending``, ``complete``,
  ``trained``);
* ``episodes``: one row per episode attempt, with its state (``running``, ``paused``,
  ``finished``, ``truncated``, ``failed``, ``retried``, ``dropped``);
* ``partials``: the latest snapshot of each unfinished episode (a
  :class:`~agentrl.types.PartialEpisode`), replaced at every checkpoint;
* ``trajectories``: finished episodes (and failed attempts) as token arrays;
* ``consumed``: which trajectories the trainer used, at which optimizer step;
* ``versions``: the weight-version history with the cost of each update.

Token arrays are stored as raw little-endian numpy bytes (int32 ids, float32
logprobs, int32 versions, int8 loss mask: 13 bytes per token); everything else is
JSON. Nothing is pickled, so opening a store never executes code. The schema version
is SQLite's ``user_version``; a store written by a newer schema is refused.

Durability: WAL with ``synchronous=NORMAL`` survives the process being killed at any
moment (a commit is in the WAL before it returns); only an OS crash or power loss
can lose the last commits. One connection, guarded by a lock, so the async
wrappers may run the calls in worker threads.

The package, by concern:

* :mod:`~agentrl.store.schema`: the schema, opening a connection, codecs, row
  decoders, and which episodes count (:data:`FINAL_STATES`, the ``run`` origin);
* :mod:`~agentrl.store.episodes`: :class:`EpisodeStore`, every read and write;
* :mod:`~agentrl.store.audit`: the audit and the statistics;
* :mod:`~agentrl.store.writer`: :class:`StoreWriter`, batched writes off the loop.
"""

from __future__ import annotations

from agentrl.store.episodes import EpisodeStore
from agentrl.store.schema import FINAL_STATES, SCHEMA_VERSION, STORE_FILE
from agentrl.store.writer import StoreWriter

__all__ = ["FINAL_STATES", "SCHEMA_VERSION", "STORE_FILE", "EpisodeStore", "StoreWriter"]
