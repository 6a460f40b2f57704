"""Plain data shared by every part of Arbiter: topology, jobs, teams, events and decisions.

Nothing here imports another Arbiter package; everything else imports this.
"""

from gpu_arbiter.domain.cluster import GPU_CATALOG, Cluster, GpuType, Node, Rack
from gpu_arbiter.domain.errors import ArbiterError, InvalidInput
from gpu_arbiter.domain.events import (
    Decision,
    Event,
    JobFinished,
    JobStopped,
    NodeDown,
    NodeUp,
    Preempt,
    Resize,
    Start,
)
from gpu_arbiter.domain.job import (
    MILLI,
    PATHOLOGIES,
    Allocation,
    Job,
    JobKind,
    JobSpec,
    JobState,
    Tier,
    checkpointed_s,
)
from gpu_arbiter.domain.team import Team, default_teams

__all__ = [
    "GPU_CATALOG",
    "MILLI",
    "PATHOLOGIES",
    "Allocation",
    "ArbiterError",
    "Cluster",
    "Decision",
    "Event",
    "GpuType",
    "InvalidInput",
    "Job",
    "JobFinished",
    "JobKind",
    "JobSpec",
    "JobState",
    "JobStopped",
    "Node",
    "NodeDown",
    "NodeUp",
    "Preempt",
    "Rack",
    "Resize",
    "Start",
    "Team",
    "Tier",
    "checkpointed_s",
    "default_teams",
]
