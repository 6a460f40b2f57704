"""Tiresias (NSDI '19), discretised two-dimensional least-attained-service (2D-LAS).

Jobs are ranked by the GPU-seconds they have received (GPUs × time), bucketed into priority
queues by thresholds; FIFO within a queue. A job that crosses a threshold while running drops a
queue and may be preempted, without regard to tiers, by a pending job of a higher queue: it is
suspended, saving its checkpoint (keeping all its progress) within the time a save takes, and
the preemptor starts when it has. Placement consolidates; idle GPUs are filled greedily.
Tiresias knows nothing of tiers, quotas or GPU types.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator

from gpu_arbiter.domain import Job
from gpu_arbiter.engine.policy import Backfill, Heterogeneity, Policy, SchedulerView

# Queue thresholds in GPU-seconds: < 1 GPU-hour, < 10 GPU-hours, the rest.
THRESHOLDS = (3600.0, 36_000.0)


def queue_of(job: Job) -> int:
    return bisect.bisect_right(THRESHOLDS, job.attained_gpu_s)


class TiresiasPolicy(Policy):
    name = "tiresias"
    quotas = False
    backfill = Backfill.GREEDY
    elastic = False
    heterogeneity = Heterogeneity.ANY
    tiers = False
    incremental = False
    suspend_saves = True

    def group_key(self, job: Job) -> int:
        return queue_of(job)

    def ordered(self, sched: SchedulerView, now: float) -> Iterator[Job]:
        return sched.queue.in_group_order()

    def may_preempt(self, sched: SchedulerView, job: Job, victim: Job, within_quota: bool) -> bool:
        return queue_of(victim) > queue_of(job)

    def victim_tiers(self, job: Job, within_quota: bool) -> tuple[int, ...]:
        return (3, 2, 1)

    def may_have_victims(
        self, sched: SchedulerView, job: Job, gpu_type: str, within_quota: bool
    ) -> bool:
        return bool(sched.running_by_type[gpu_type])

    def next_wakeup(self, sched: SchedulerView, now: float) -> float | None:
        """The next time a running job crosses a queue threshold, if anyone is waiting."""
        if not len(sched.queue):
            return None
        best = math.inf
        for job in sched.running.values():
            job.advance(now)
            q = queue_of(job)
            if q < len(THRESHOLDS) and job.gpus_held:
                best = min(best, now + (THRESHOLDS[q] - job.attained_gpu_s) / job.gpus_held)
        return best + 1e-6 if best < math.inf else None
