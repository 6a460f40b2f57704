"""What the engine decides (`Decision`) and what drivers report back (`Event`)."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_arbiter.domain.job import Allocation


@dataclass(frozen=True, slots=True)
class Start:
    """Start `job_id` on exactly `allocation`. `borrowed` marks capacity beyond its quota."""

    job_id: str
    allocation: Allocation
    borrowed: bool = False


@dataclass(frozen=True, slots=True)
class Preempt:
    """Stop `job_id` after `grace_s` seconds (0: at once). With `checkpoint` the job is asked
    to save first (tier 2). `reason` says why, for the audit log and the team."""

    job_id: str
    grace_s: float
    reason: str
    for_job: str | None = None
    checkpoint: bool = False


@dataclass(frozen=True, slots=True)
class Resize:
    """Change an elastic job's allocation to `allocation` (shrink or grow, S8)."""

    job_id: str
    allocation: Allocation
    reason: str


Decision = Start | Preempt | Resize


@dataclass(frozen=True, slots=True)
class JobFinished:
    job_id: str
    at: float


@dataclass(frozen=True, slots=True)
class JobStopped:
    """A job stopped after a Preempt (its grace ran out or it exited on the signal)."""

    job_id: str
    at: float


@dataclass(frozen=True, slots=True)
class JobFailed:
    """A job exited on its own with a non-zero code (not after a Preempt); `exit_code` is
    negative when the executor only knows it died (e.g. killed while nobody watched)."""

    job_id: str
    at: float
    exit_code: int


@dataclass(frozen=True, slots=True)
class JobLost:
    """A job's run ended because its node failed under it (Slurm's NODE_FAIL, a node set down):
    not the job's doing, so it is requeued from its checkpoint, never failed for it (F2)."""

    job_id: str
    at: float
    reason: str


@dataclass(frozen=True, slots=True)
class JobLaunchFailed:
    """A job's command could not be started at all (exec refused its environment, a missing
    executable, sbatch refused the job): it fails at once and costs nothing. `reason` is the
    executor's own error."""

    job_id: str
    at: float
    reason: str


@dataclass(frozen=True, slots=True)
class JobPlaced:
    """A running job got other GPU indices on its nodes than the engine chose (Slurm picks the
    GPUs of a gres request itself): the indices the job really has, to be recorded."""

    job_id: str
    at: float
    gpus_by_node: tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True)
class NodeDown:
    node: str
    at: float
    reason: str


@dataclass(frozen=True, slots=True)
class NodeUp:
    node: str
    at: float


Event = (
    JobFinished | JobStopped | JobFailed | JobLost | JobLaunchFailed | JobPlaced | NodeDown | NodeUp
)
