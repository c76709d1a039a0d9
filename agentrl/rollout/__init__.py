"""The rollout engine: episodes (:class:`EpisodeRunner`) and many at once (:class:`Scheduler`)."""

from agentrl.config import RolloutConfig
from agentrl.rollout.runner import EpisodeProgress, EpisodeRunner
from agentrl.rollout.scheduler import Scheduler, tasks_for

__all__ = [
    "EpisodeProgress",
    "EpisodeRunner",
    "RolloutConfig",
    "Scheduler",
    "tasks_for",
]
