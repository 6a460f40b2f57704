"""The pure scheduling engine: one cycle from a cluster state to decisions."""

from gpu_arbiter.engine.config import EngineConfig
from gpu_arbiter.engine.policy import Policy, get_policy
from gpu_arbiter.engine.scheduler import CycleResult, Scheduler

__all__ = ["CycleResult", "EngineConfig", "Policy", "Scheduler", "get_policy"]
