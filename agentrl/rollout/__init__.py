"""The rollout engine: episodes (:class:`EpisodeRunner`) and many at once (:class:`Scheduler`)."""

from agentrl.rollout.runner import EpisodeProgress, EpisodeRunner, RolloutConfig
from agentrl.rollout.scheduler import Scheduler, SchedulerConfig, tasks_for

__all__ = [
    "EpisodeProgress",
    "EpisodeRunner",
    "RolloutConfig",
    "Scheduler",
    "SchedulerConfig",
    "tasks_for",
]
