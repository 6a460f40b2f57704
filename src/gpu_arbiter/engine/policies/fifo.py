"""First come, first served: strict submission order, head-of-line blocking, no preemption,
spread placement (the naive default of many clusters). A lower bound to compare against."""

from collections.abc import Iterator

from gpu_arbiter.domain import Job
from gpu_arbiter.engine.policy import Backfill, Heterogeneity, Placement, Policy, SchedulerView


class FifoPolicy(Policy):
    name = "fifo"
    placement = Placement.SPREAD
    quotas = False
    preemption = False
    backfill = Backfill.NONE
    elastic = False
    heterogeneity = Heterogeneity.ANY
    tiers = False
    incremental = False

    def group_key(self, job: Job) -> int:
        return 0

    def ordered(self, sched: SchedulerView, now: float) -> Iterator[Job]:
        return sched.queue.in_group_order()
