"""Every setting of agentrl: one tree of frozen dataclasses at the bottom of the package.

Components import their own section (``from agentrl.config import RolloutConfig``);
:class:`RunConfig` is the tree ``agentrl train`` loads from TOML. Layer 0: this package
imports only the standard library and :mod:`agentrl.errors`.
"""

from agentrl.config.cluster import ClusterConfig
from agentrl.config.health import HealthConfig
from agentrl.config.loader import RunConfig
from agentrl.config.sections import (
    CorrectionMode,
    EnvConfig,
    EvalConfig,
    InferenceConfig,
    JobConfig,
    LogConfig,
    LoraConfig,
    LossConfig,
    LossKind,
    ModelConfig,
    RolloutConfig,
    TrainConfig,
    TrainerConfig,
    UpdatePolicy,
)

__all__ = [
    "ClusterConfig",
    "CorrectionMode",
    "EnvConfig",
    "EvalConfig",
    "HealthConfig",
    "InferenceConfig",
    "JobConfig",
    "LogConfig",
    "LoraConfig",
    "LossConfig",
    "LossKind",
    "ModelConfig",
    "RolloutConfig",
    "RunConfig",
    "TrainConfig",
    "TrainerConfig",
    "UpdatePolicy",
]
