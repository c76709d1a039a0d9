"""``Runner``: what the scheduler, the rollout controller and the status view ask of a runner.

Two classes run episodes: :class:`~agentrl.rollout.runner.EpisodeRunner` (in this
process) and :class:`~agentrl.rollout.workers.WorkerRunner` (in worker processes,
``rollout.workers > 1``). :func:`~agentrl.rollout.workers.open_runner` hands back
either as a :class:`Runner`, and its callers (:class:`~agentrl.rollout.Scheduler`,
:class:`~agentrl.rollout.controller.RolloutController`, :class:`~agentrl.status.RunStatus`
and the run's wiring) use nothing else: ``tests/rollout/test_base.py`` checks that both
classes have every member here and that the callers use no member that is not here.

The admission gate belongs to the runner from its construction: a weight update closes
it (no generation call starts) and opens it again; nobody replaces it.

This module owns only the protocol; it imports nothing that runs episodes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from agentrl.inference.base import InferenceClient
from agentrl.rollout.episode import EpisodeProgress
from agentrl.runtime.metrics import Metrics
from agentrl.types import PartialEpisode, Task, Trajectory


class Runner(Protocol):
    """Runs episodes against one inference client, and parks them for weight updates."""

    @property
    def client(self) -> InferenceClient:
        """The inference engine every episode's generation calls go to."""
        ...

    @property
    def metrics(self) -> Metrics:
        """Where the runner's counts and timings go."""
        ...

    @property
    def admission(self) -> asyncio.Event:
        """The admission gate, awaited before every generation call; a weight update
        closes it (``clear``) and opens it (``set``)."""
        ...

    @property
    def live(self) -> Mapping[str, EpisodeProgress]:
        """The running episodes' progress, by episode id."""
        ...

    async def run(self, task: Task, episode_id: str, attempt: int = 0) -> list[Trajectory]:
        """Run one episode; return its trajectories (several if the template re-segmented).

        Raises:
            EpisodeDropped: a weight update in ``drop`` mode discarded it.
        """
        ...

    async def resume(self, partial: PartialEpisode) -> list[Trajectory]:
        """Continue a checkpointed episode from its exact token prefix."""
        ...

    @property
    def parked(self) -> tuple[str, ...]:
        """The ids of the episodes held at the closed gate, in parking order."""
        ...

    def snapshot(self, episode_id: str) -> PartialEpisode:
        """A checkpoint of a parked episode."""
        ...

    def oldest_version(self, episode_id: str) -> int | None:
        """The policy version of a parked episode's oldest sampled token (None: none yet)."""
        ...

    def prefix_tokens(self, episode_id: str) -> int:
        """The tokens a parked episode re-submits when it resumes."""
        ...

    def drop(self, episode_id: str, reason: str) -> int:
        """Discard a parked episode when it is released; return its sampled tokens."""
        ...

    async def wait_parked(self, episode_ids: set[str]) -> None:
        """Wait until each of these episodes is parked at the gate or has ended."""
        ...
