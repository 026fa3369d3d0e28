"""The behaviour contracts every plugin implements (ABCs)."""

from astraflow.contracts.advantage import AdvantageEstimator
from astraflow.contracts.data import BatchSampler, DataAlgorithm, TaskSelector, TrajectoryFilter
from astraflow.contracts.logger import MetricLogger
from astraflow.contracts.rollout import RolloutBackend
from astraflow.contracts.trainer import TrainerBackend
from astraflow.contracts.workflow import PolicyHandle, Reward, TaskSource, Tokenizer, Workflow

__all__ = [
    "AdvantageEstimator",
    "BatchSampler",
    "DataAlgorithm",
    "MetricLogger",
    "PolicyHandle",
    "Reward",
    "RolloutBackend",
    "TaskSelector",
    "TaskSource",
    "Tokenizer",
    "TrainerBackend",
    "TrajectoryFilter",
    "Workflow",
]
