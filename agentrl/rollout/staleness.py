"""``Staleness``: the one rule for how far behind the trainer rollouts may fall.

``rollout.max_staleness = k`` promises that an episode admitted at trainer version
``v`` is trained by version ``v + k`` at the latest. Three places enforce it:

* admission (:class:`~agentrl.rollout.scheduler.Scheduler`): with ``B`` trajectories
  per optimizer step and the trainer at version ``v``, episodes may be started while

      started <= (v + k + 1) * B

  (:meth:`Staleness.capacity`). The trainer consumes ``B`` trajectories per version,
  so at most ``(k + 1) * B`` episodes are generated-but-untrained or in flight at any
  time (AReaL's and SkyRL's capacity rule);
* the trainer's batch (:meth:`~agentrl.queue.TrajectoryQueue.get_batch` with ``due``):
  groups end out of admission order, so a step at version ``u`` takes every group
  admitted at ``u - k`` or before first, waiting for any still running. At ``k = 1``
  admission leaves at most a batch due at once; at larger ``k`` an unlucky order can
  leave more, and the oldest batch goes first;
* the ``drop`` update policy (:class:`~agentrl.rollout.controller.RolloutController`):
  a parked episode whose oldest sampled token would be more than ``k`` versions behind
  the new version is discarded (:meth:`Staleness.too_stale`).

It does not own the trainer's per-token mask (``trainer.max_token_staleness``), a
different setting with its own meaning. Pure arithmetic: no I/O, no state.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class Staleness:
    """The staleness bound ``max_staleness`` (None: unbounded).

    Attributes:
        max_staleness: how many versions behind the trainer the oldest sampled token of
            an episode may be when it is trained (``rollout.max_staleness``).
    """

    max_staleness: int | None

    def __post_init__(self) -> None:
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"max_staleness is {self.max_staleness}; it must be >= 0 or None")

    def too_stale(self, oldest_version: int | None, version: int) -> bool:
        """Whether tokens sampled at ``oldest_version`` are more than ``max_staleness``
        versions behind ``version`` (never when unbounded or nothing was sampled)."""
        if self.max_staleness is None or oldest_version is None or oldest_version < 0:
            return False
        return version - oldest_version > self.max_staleness

    def capacity(self, version: int, batch_size: int | None, started: int) -> int | None:
        """Episodes that may still be started with the trainer at ``version``.

        ``(version + max_staleness + 1) * batch_size - started``, where ``started``
        counts every episode admitted since the run began. None (no bound) when
        ``max_staleness`` or ``batch_size`` is None.
        """
        if self.max_staleness is None or batch_size is None:
            return None
        return (version + self.max_staleness + 1) * batch_size - started
