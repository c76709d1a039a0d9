"""The seams between the rollout engine and the trainer: what one asks of the other.

The trainer never imports the rollout engine (a test holds the layers; see
``docs/architecture.md``). It drives generation and publishes weights through the two
protocols here, and the rollout engine satisfies them structurally:

* :class:`WeightSync`: one weight update (``update_weights``), returning its cost as
  :class:`UpdateStats`. Implemented by :class:`~agentrl.rollout.controller.RolloutController`.
* :class:`RolloutSource`: turns tasks into complete groups on the trajectory queue
  (``run``), stops admitting (``stop``), hears of new versions (``notify_version``)
  and, on resume, of the episodes admitted before the restart (``resume_admitted``);
  its ``staleness`` is the bound admission holds (a :class:`StalenessBound`).
  Implemented by :class:`~agentrl.rollout.scheduler.Scheduler`.

This module owns only the protocols and the value that crosses the seam; it imports
nothing above :mod:`agentrl.types`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterable, Callable, Iterable
from typing import Any, Protocol

from agentrl.types import Task


@dataclasses.dataclass(frozen=True, slots=True)
class UpdateStats:
    """What one weight update cost."""

    version: int
    policy: str
    source: str
    pause_to_resume_s: float
    reload_s: float
    store_write_s: float
    episodes_paused: int
    requests_aborted: int
    tokens_reprefilled: int
    tokens_discarded: int
    episodes_dropped: int

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class WeightSync(Protocol):
    """Loads new weights into the inference engine as the next policy version."""

    async def update_weights(
        self,
        weights_dir: str | None = None,
        *,
        lora_dir: str | None = None,
        push: Callable[[], Any] | None = None,
        version: int | None = None,
    ) -> UpdateStats:
        """Publish exactly one of: a safetensors folder, a peft adapter folder, or
        ``push`` (a blocking function that streams the weights in, e.g. over NCCL).

        ``version``: the label to load under (None: the engine's next version).
        """
        ...


class StalenessBound(Protocol):
    """How far behind the trainer an episode's tokens may fall (``rollout.max_staleness``)."""

    @property
    def max_staleness(self) -> int | None:
        """Versions behind the trainer the oldest sampled token may be (None: unbounded)."""
        ...


class RolloutSource(Protocol):
    """Generates complete groups into the trajectory queue the trainer reads."""

    @property
    def staleness(self) -> StalenessBound:
        """The staleness bound admission holds (the training loop waits by it)."""
        ...

    async def run(self, tasks: Iterable[Task] | AsyncIterable[Task]) -> None:
        """Run every task (until :meth:`stop`); return when every admitted group is queued."""
        ...

    def stop(self) -> None:
        """Admit nothing more; running groups finish."""
        ...

    async def notify_version(self) -> None:
        """Called after the trainer publishes a version: admission may open up."""
        ...

    def generation_idle(self) -> bool:
        """Whether no episode is being generated right now (the trainer may then use
        the cores generation leaves idle)."""
        ...

    def resume_admitted(self, count: int) -> None:
        """On resume: count ``count`` episodes as admitted before the restart (the
        trajectories the restored trainer has consumed), so admission goes on from there."""
        ...
