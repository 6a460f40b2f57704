"""The context of one cycle, passed explicitly to every step that needs it: the walk's
reservations, caches that hold while the cycle lasts, what the steps tell each other about the
job being looked at, and the view of the scheduler the policy gets during the cycle
(`CycleView`), whose estimates read the cycle's caches."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpu_arbiter.domain import Job
    from gpu_arbiter.engine.backfill import Reservation
    from gpu_arbiter.engine.scheduler import Scheduler


@dataclass(slots=True)
class CycleContext:
    """What one cycle has worked out so far, passed to every step of its walk."""

    reservations: dict[str, Reservation] = field(default_factory=dict)
    now: float = 0.0
    view: CycleView | None = None  # what the policy sees of the scheduler in this cycle
    dry_runs: dict[tuple, tuple[int, float | None]] = field(default_factory=dict)
    scopes: dict[tuple, tuple[bool, bool] | None] = field(default_factory=dict)  # one try's
    shadows: dict[tuple[str, int], tuple[int, float]] = field(default_factory=dict)
    attempts: int = 0
    preempted: int = 0
    high_power: dict[int, int] = field(default_factory=dict)
    blocked_types: set[str] = field(default_factory=set)
    stranded_types: set[str] = field(default_factory=set)
    waiting: dict[str, int] = field(default_factory=dict)  # GPUs blocked jobs want, by type
    stop: bool = False
    timely: bool = False  # the job being looked at met a rule that can change with time alone
    wait_on: str | None = None  # the type the job being looked at waits for, if not its fastest
    kept_for: str | None = None  # whose reservation kept the job being looked at off free GPUs
    retry: bool = False  # a per-cycle limit (power stagger) held a job back: look again next cycle
    # A victim stopped at once went back to the queue behind the walk: it may fit elsewhere now.
    stopped_at_once: bool = False


class CycleView:
    """The scheduler as a policy sees it during one cycle (`engine.policy.SchedulerView`): the
    queue, running indexes, capacity and books to read, the estimates and dry runs of this
    cycle (`shadow_time`, `preemption_wait`, which use and fill the cycle's caches), and the
    moves a policy may make. Nothing else of the scheduler is reachable through it."""

    __slots__ = (
        "_ctx",
        "_sched",
        "admissible",
        "cfg",
        "cluster",
        "ends_by_type",
        "est_runtime",
        "fair",
        "faster_types",
        "find_for",
        "hold_of",
        "index",
        "jobs",
        "move",
        "notice_of_tier",
        "notice_s",
        "notice_stop",
        "pending_stops",
        "preempt",
        "queue",
        "reranked",
        "rule_out_move",
        "running",
        "running_by_tier",
        "running_by_type",
        "slower_than",
        "speed",
        "type_epoch",
        "types_by_speed",
    )

    def __init__(self, sched: Scheduler, ctx: CycleContext) -> None:
        self._sched, self._ctx = sched, ctx
        self.cluster, self.cfg, self.index = sched.cluster, sched.cfg, sched.index
        self.queue, self.fair, self.jobs = sched.queue, sched.fair, sched.jobs
        self.running, self.running_by_type = sched.running, sched.running_by_type
        self.running_by_tier, self.ends_by_type = sched.running_by_tier, sched.ends_by_type
        self.slower_than = sched.slower_than
        self.pending_stops, self.hold_of = sched.pending_stops, sched.hold_of
        self.types_by_speed, self.faster_types = sched.types_by_speed, sched.faster_types
        self.speed, self.est_runtime = sched.speed, sched.est_runtime
        self.admissible, self.find_for = sched.admissible, sched.find_for
        self.notice_s, self.notice_of_tier = sched.notice_s, sched.notice_of_tier
        self.preempt, self.move = sched.preempt, sched.move
        self.notice_stop, self.rule_out_move = sched.notice_stop, sched.rule_out_move
        self.type_epoch, self.reranked = sched.type_epoch, sched.reranked

    def begin(self, ctx: CycleContext) -> CycleView:
        """This view for the cycle of `ctx` (what it reads of the scheduler is the same objects
        for the scheduler's life; only the cycle's caches are new)."""
        self._ctx = ctx
        return self

    def shadow_time(self, gpu_type: str, n: int, now: float) -> float:
        return self._sched.shadow_time(gpu_type, n, now, self._ctx)

    def preemption_wait(self, job: Job, gpu_type: str, n: int, now: float) -> float | None:
        return self._sched.preemption_wait(job, gpu_type, n, now, self._ctx)
