"""The rollout engine: episodes (:class:`EpisodeRunner`) and many at once (:class:`Scheduler`)."""

from agentrl.config import RolloutConfig
from agentrl.rollout.episode import EpisodeProgress
from agentrl.rollout.runner import EpisodeRunner
from agentrl.rollout.scheduler import Scheduler, tasks_for

__all__ = [
    "EpisodeProgress",
    "EpisodeRunner",
    "RolloutConfig",
    "Scheduler",
    "tasks_for",
]
