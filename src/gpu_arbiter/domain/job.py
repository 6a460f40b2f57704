"""Jobs: what a user asks for (`JobSpec`, immutable) and what becomes of it (`Job`, mutable).

Work is measured in *reference seconds*: the time the job would run on `gpus` GPUs of speed 1.0
(an H100). Running on `g` GPUs of a type with speed factor `s` advances work at `s * g / gpus`
reference seconds per second (elastic jobs scale linearly between their min and max).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum

from gpu_arbiter.domain.errors import InvalidInput

MILLI = 1000  # thousandths of a GPU in one GPU: the `gpu_milli` of a whole-GPU job


class Tier(IntEnum):
    """S1: 1 = core training (never preempted), 2 = business fine-tuning (preempted with notice),
    3 = exploratory (preempted at once)."""

    CORE = 1
    BUSINESS = 2
    EXPLORATORY = 3


class JobState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class JobKind(StrEnum):
    TRAINING = "training"
    INFERENCE = "inference"


# F5 pathologies a simulated job can develop (reliability.Pathology names them too).
PATHOLOGIES = ("nan_loss", "grad_explosion", "divergence", "io_stall")


def checkpointed_s(productive_s: float, interval_s: float | None) -> float:
    """Of `productive_s` progress-making seconds of one run segment, how many the segment's
    last periodic checkpoint (every `interval_s` of them) covers; 0 without checkpointing.
    A checkpoint due exactly at the end counts as taken. The one rule for lost work (F2)."""
    if interval_s is None:
        return 0.0
    return min(productive_s, math.floor(productive_s / interval_s + 1e-9) * interval_s)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A request for GPUs. Validated on construction; an invalid spec raises `InvalidInput`.

    `gpu_types` maps each accepted GPU type to the job's speed on it relative to an H100;
    empty means any type at the catalog speed. `walltime_s` is the user's estimate (what
    backfill trusts); `duration_s` is the real work, known only to the simulator.
    """

    id: str
    team: str
    tier: Tier = Tier.EXPLORATORY
    gpus: int = 1
    duration_s: float = 3600.0
    submit_s: float = 0.0
    gpu_types: Mapping[str, float] = field(default_factory=dict)
    walltime_s: float | None = None
    min_gpus: int | None = None
    max_gpus: int | None = None
    max_racks: int | None = None
    tp_size: int = 1
    checkpoint_interval_s: float | None = None
    power_profile: str = "normal"
    gpu_milli: int = MILLI
    kind: JobKind = JobKind.TRAINING
    latency_slo_ms: float | None = None  # S9: the P99 latency an inference service promises
    justification: str | None = None
    data_locality: str | None = None
    user: str | None = None
    command: str | None = None
    # Simulation only, like `duration_s`: the F5 pathology the job develops (one of
    # PATHOLOGIES) and when, in seconds of its run, so circuit breakers have work to do.
    pathology: str | None = None
    pathology_onset_s: float = 3600.0
    # (fewest, most) GPUs it runs on: `min_gpus`/`max_gpus`, else `gpus`. Read on every step
    # of the engine's walk, so worked out once (the spec is frozen).
    elastic_range: tuple[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"job {self.id!r}"
        rng = (self.min_gpus or self.gpus, self.max_gpus or self.gpus)
        object.__setattr__(self, "elastic_range", rng)
        if not self.id:
            raise InvalidInput("job: id must not be empty")
        if not self.team:
            raise InvalidInput(f"{where}: team must not be empty")
        try:
            Tier(self.tier)
        except ValueError:
            raise InvalidInput(f"{where}: tier must be 1, 2 or 3, got {self.tier!r}") from None
        if self.gpus < 1:
            raise InvalidInput(f"{where}: gpus must be >= 1, got {self.gpus}")
        if not (self.duration_s > 0 and math.isfinite(self.duration_s)):
            raise InvalidInput(
                f"{where}: duration_s must be a positive number, got {self.duration_s}"
            )
        if not (self.submit_s >= 0 and math.isfinite(self.submit_s)):
            raise InvalidInput(f"{where}: submit_s must be >= 0, got {self.submit_s}")
        for name, speed in self.gpu_types.items():
            if not (speed > 0 and math.isfinite(speed)):
                raise InvalidInput(f"{where}: speed on {name} must be > 0, got {speed}")
        if self.walltime_s is not None and self.walltime_s <= 0:
            raise InvalidInput(f"{where}: walltime_s must be > 0, got {self.walltime_s}")
        lo, hi = self.elastic_range
        if not 1 <= lo <= self.gpus <= hi:
            raise InvalidInput(
                f"{where}: need 1 <= min_gpus ({lo}) <= gpus ({self.gpus}) <= max_gpus ({hi})"
            )
        if self.max_racks is not None and self.max_racks < 1:
            raise InvalidInput(f"{where}: max_racks must be >= 1, got {self.max_racks}")
        if self.tp_size < 1 or lo % self.tp_size or hi % self.tp_size or self.gpus % self.tp_size:
            raise InvalidInput(
                f"{where}: tp_size {self.tp_size} must divide gpus, min_gpus and max_gpus"
            )
        if self.checkpoint_interval_s is not None and self.checkpoint_interval_s <= 0:
            raise InvalidInput(
                f"{where}: checkpoint_interval_s must be > 0, got {self.checkpoint_interval_s}"
            )
        if self.power_profile not in ("normal", "high"):
            raise InvalidInput(
                f"{where}: power_profile must be 'normal' or 'high', got {self.power_profile!r}"
            )
        if not 1 <= self.gpu_milli <= MILLI:
            raise InvalidInput(f"{where}: gpu_milli must be in 1..1000, got {self.gpu_milli}")
        if self.gpu_milli < MILLI and self.gpus != 1:
            raise InvalidInput(f"{where}: a fractional GPU (gpu_milli < 1000) needs gpus == 1")
        if self.gpu_milli < MILLI and self.is_elastic:
            raise InvalidInput(f"{where}: a fractional GPU (gpu_milli < 1000) cannot be elastic")
        if self.latency_slo_ms is not None:
            if self.kind != JobKind.INFERENCE:
                raise InvalidInput(f"{where}: latency_slo_ms is for inference jobs only")
            if not (self.latency_slo_ms > 0 and math.isfinite(self.latency_slo_ms)):
                raise InvalidInput(
                    f"{where}: latency_slo_ms must be > 0, got {self.latency_slo_ms}"
                )
        if self.pathology is not None and self.pathology not in PATHOLOGIES:
            raise InvalidInput(
                f"{where}: pathology must be one of {', '.join(PATHOLOGIES)}, "
                f"got {self.pathology!r}"
            )
        if not (self.pathology_onset_s >= 0 and math.isfinite(self.pathology_onset_s)):
            raise InvalidInput(
                f"{where}: pathology_onset_s must be >= 0, got {self.pathology_onset_s}"
            )

    @property
    def is_elastic(self) -> bool:
        lo, hi = self.elastic_range
        return lo != hi

    def speed_on(self, gpu_type: str, catalog_speed: float) -> float | None:
        """Relative speed of this job on `gpu_type`, or None when the job does not accept it."""
        if not self.gpu_types:
            return catalog_speed
        return self.gpu_types.get(gpu_type)


@dataclass(frozen=True, slots=True)
class Allocation:
    """Exactly which GPUs a job holds: `slots` is ((node index, (gpu index, ...)), ...)."""

    gpu_type: str
    slots: tuple[tuple[int, tuple[int, ...]], ...]
    gpus: int = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", sum(len(g) for _, g in self.slots))

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(n for n, _ in self.slots)


@dataclass(slots=True, eq=False)
class Job:
    """The life of one job. The engine and the drivers update it; it does no I/O."""

    spec: JobSpec
    tier: Tier
    state: JobState = JobState.PENDING
    allocation: Allocation | None = None
    speed: float = 0.0  # speed factor on the current allocation's GPU type
    borrowed: bool = False  # running beyond its team's guaranteed quota (S2)
    preempting: bool = False  # a Preempt decision is out and the job has not stopped yet
    progress_s: float = 0.0  # reference seconds of work done and not lost
    checkpoint_s: float = 0.0  # progress saved by the last checkpoint
    updated_at: float = 0.0  # time progress_s was last brought up to date
    started_at: float | None = None  # start of the current run
    segment_start: float = 0.0  # start of the current run or of the last resize
    segment_progress: float = 0.0  # progress_s at segment_start
    stalled_until: float = 0.0  # no progress before this time (restoring a checkpoint)
    expected_end_at: float = math.inf  # end by the user's walltime estimate (for backfill)
    first_start: float | None = None
    finished_at: float | None = None
    queued_since: float = 0.0
    queue_s: float = 0.0  # total time spent pending
    attained_gpu_s: float = 0.0  # GPU-seconds received (for least-attained-service policies)
    busy_gpu_s: float = 0.0  # GPU-seconds held
    lost_gpu_s: float = 0.0  # GPU-seconds whose progress was thrown away
    useful_gpu_s: float = 0.0  # GPU-seconds whose progress was kept (goodput, F4)
    preemptions: int = 0
    restarts: int = 0
    failure_demoted: bool = False
    # A tier-1 job trying, or running, at tier 2 on GPUs beyond its team's guarantee and the
    # pool (S2, `EngineConfig.tier1_borrows_at_tier2`); it is queued at tier 1 again when it
    # stops.
    borrows_at_tier2: bool = False
    seq: int = 0
    # The accepted types of the scheduler's cluster it can run on, fastest first: set when the
    # scheduler queues the job (`TypeFit.types_by_speed`), and read by every step of a cycle.
    types: list[str] | None = field(default=None, repr=False, compare=False)
    # The spec's, copied: read on every step of every cycle, and a property costs a call.
    id: str = field(init=False)
    team: str = field(init=False)

    def __post_init__(self) -> None:
        self.id = self.spec.id
        self.team = self.spec.team

    @property
    def gpus_held(self) -> int:
        return self.allocation.gpus if self.allocation else 0

    @property
    def milli_held(self) -> int:
        """GPUs held in thousandths of a GPU: a fractional job (S11) its `gpu_milli`. What
        quotas count (`engine.admission.QuotaBook`)."""
        return self.allocation.gpus * self.spec.gpu_milli if self.allocation else 0

    @property
    def gpu_share(self) -> float:
        """GPUs held, counting a fractional job (S11) at its share of one GPU."""
        if self.allocation is None:
            return 0.0
        return self.allocation.gpus * self.spec.gpu_milli / MILLI

    @property
    def rate(self) -> float:
        """Reference seconds of work per wall second on the current allocation."""
        if self.allocation is None:
            return 0.0
        return self.speed * self.allocation.gpus / self.spec.gpus

    @property
    def remaining_s(self) -> float:
        return max(0.0, self.spec.duration_s - self.progress_s)

    def advance(self, now: float) -> None:
        """Bring progress and GPU-time counters up to `now` (the job keeps its allocation).

        GPUs are held for the whole interval, but progress only accrues after `stalled_until`
        (the time a restarted job spends restoring its checkpoint)."""
        dt = now - self.updated_at
        if dt > 0 and self.allocation is not None:
            held = self.gpu_share
            self.progress_s = self.progress_at(now)
            self.busy_gpu_s += held * dt
            self.attained_gpu_s += held * dt
        self.updated_at = max(self.updated_at, now)

    def progress_at(self, now: float) -> float:
        """Progress `advance(now)` would reach, without changing anything.

        Worked out from the start of the segment (the rate is fixed within one), not from the
        last `advance`, so it does not depend on how often anybody looked at the job: a step
        that reads one job more or less leaves every other result bit for bit the same."""
        if self.allocation is None or now <= self.updated_at:
            return self.progress_s
        productive = now - max(self.segment_start, self.stalled_until)
        if productive <= 0:
            return self.progress_s
        reached = self.segment_progress + self.rate * productive
        return min(self.spec.duration_s, max(self.progress_s, reached))

    def unsaved_at(self, now: float) -> float:
        """Progress a stop at `now` would throw away: what was made since the last checkpoint
        (reference seconds; changes nothing)."""
        progress = self.progress_at(now)
        return progress - self.saved_progress(now, progress)

    def begin_segment(self, now: float, stall_s: float = 0.0) -> None:
        """Start a run segment (a start, restart or resize) at `now`."""
        self.updated_at = now
        self.segment_start = now
        self.segment_progress = self.progress_s
        self.stalled_until = now + stall_s
        # The walltime estimate is in reference seconds for the requested size, like progress,
        # so what is left of it runs at the current rate. Only what the user said is used.
        estimate = self.spec.walltime_s
        if estimate is None or self.rate <= 0:
            self.expected_end_at = math.inf
        else:
            self.expected_end_at = now + stall_s + max(0.0, estimate - self.progress_s) / self.rate

    def close_segment(self, kept: float) -> None:
        """End the current run segment keeping `kept` reference seconds of progress (call after
        `advance`): the GPU time that produced kept progress is useful, the rest is lost."""
        if self.allocation is not None and self.rate > 0:
            gpus = self.gpu_share
            self.useful_gpu_s += max(0.0, kept - self.segment_progress) / self.rate * gpus
            self.lost_gpu_s += max(0.0, self.progress_s - kept) / self.rate * gpus
        self.progress_s = kept
        self.checkpoint_s = kept

    def saved_progress(self, now: float, progress: float | None = None) -> float:
        """Progress kept by the last periodic checkpoint at or before `now` (F2).

        Checkpoints are taken every `checkpoint_interval_s` of productive run time in the current
        segment; a job without checkpointing keeps only what an explicit save (`checkpoint_s`)
        kept. Call after `advance(now)`, or pass the `progress_at(now)`."""
        if progress is None:
            progress = self.progress_s
        interval = self.spec.checkpoint_interval_s
        if interval is None or self.allocation is None:
            return min(self.checkpoint_s, progress)
        productive = max(0.0, now - max(self.segment_start, self.stalled_until))
        periodic = self.segment_progress + self.rate * checkpointed_s(productive, interval)
        return min(progress, max(self.checkpoint_s, periodic))
