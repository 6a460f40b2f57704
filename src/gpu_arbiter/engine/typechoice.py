"""Whether a pending job should start now on a slow GPU type or wait for a fast one (S7).

Walking accepted types fastest first and starting on the first with free GPUs puts a job that
runs 6x slower on a K80 than on a V100 onto the K80 whenever the V100s are busy for a moment,
and there it stays (a tier-1 job never moves again, a tier-2 job only after a notice, see
`engine.migration`).
This step compares, for every accepted type `t`, the expected finish

    eta(t) = wait(t) + runtime(t)

where `runtime` is the walltime estimate at the type's speed (`SchedulerView.est_runtime`) and
`wait` is 0 when enough GPUs are free, and otherwise the sooner of: preempting (0 for a plan
that stops its victims at once and is worth their lost work, or the expected wait of a plan
that gives notice, whose victims save and stop within a minute or so, `SchedulerView.notice_s`;
dry runs of the scheduler's own victim rules) and running jobs ending (the EASY shadow time,
`engine.backfill.reserve`). Only the types the job may take now count (a tier-1 job beyond
its quota and the pool may not, S2), and only with a wait within the job's queueing target
(`EngineConfig.queue_target_s`, by tier; tier 1's for a tier-1 job trying at tier 2, which
must not pass free slow GPUs to wait for fast ones expected only within tier 2's target): a
longer wait rests on estimates that may slip. If the best of those is free, the policy's order
stands (Arbiter's comparative-advantage plan). If not, the job is offered only the types whose eta
is within `SLACK` of the best's: it preempts there, or waits under a reservation for the fast
GPUs instead of taking slow ones.
So a tier-1 job whose fastest type frees only in hours still preempts tier 3 at once on the
next-fastest rather than start on a type that runs it several times slower for good. Without
estimates the types are offered as they were. Pure: it only reads the scheduler.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from gpu_arbiter.domain import Job, Tier

if TYPE_CHECKING:
    from gpu_arbiter.engine.policy import SchedulerView

SLACK = 1.1  # a type within 10 % of the best eta is as good as the best


def wait_for(
    sched: SchedulerView, job: Job, gpu_type: str, n: int, now: float
) -> tuple[float, bool]:
    """(expected wait, whether it comes from preempting) for `n` GPUs of `gpu_type`."""
    free = sched.index.type_free[gpu_type]
    if free >= n:
        return 0.0, False
    by_preempting = sched.preemption_wait(job, gpu_type, n, now)
    by_ends = sched.shadow_time(gpu_type, n, now) - now
    if by_preempting is not None and by_preempting <= by_ends:
        return by_preempting, True
    return by_ends, False


def patient_types(sched: SchedulerView, job: Job, types: list[str], now: float) -> list[str]:
    """`types` (in the policy's order), cut to those worth trying now (see the module doc)."""
    if len(types) < 2 or job.spec.walltime_s is None:
        return types
    n = job.spec.elastic_range[0]
    free = sched.index.type_free
    for t in types:
        if free[t] >= n:
            break
    else:
        return types  # nothing to choose between: none free (the common case, checked first)
    # A type the job may not take now (a tier-1 job beyond its quota and the pool) is no option.
    options = [t for t in types if sched.admissible(job, t, n)]
    if all(free[t] >= n for t in options) or not any(free[t] >= n for t in options):
        return types  # nothing to choose between: all free, or none free
    runs = {t: sched.est_runtime(job, t, n) for t in options}
    if not all(math.isfinite(run) for run in runs.values()):
        return types
    # A tier-1 job trying at tier 2 keeps tier 1's target: it is a tier-1 job that is waited for.
    tier = Tier.CORE if job.borrows_at_tier2 else job.tier
    target = sched.cfg.queue_target_s[int(tier) - 1]
    eta: dict[str, float] = {}
    waits: dict[str, tuple[float, bool]] = {}

    def weigh(t: str) -> None:
        waits[t] = wait_for(sched, job, t, n, now)
        if waits[t][0] <= target:  # a longer wait is not one to make: the estimates may slip
            eta[t] = waits[t][0] + runs[t]

    # A busy type beats the free ones only if it runs faster than the best of them, and makes
    # the cut below only if it runs within SLACK of the best: the waits (dry runs of the
    # preemption step, shadow times) of the other types are never needed.
    fastest_free = min(runs[t] for t in options if free[t] >= n)
    for t in options:
        if free[t] >= n:
            waits[t], eta[t] = (0.0, False), runs[t]
        elif runs[t] <= fastest_free:
            weigh(t)
    best = min(eta, key=lambda t: (eta[t], types.index(t)))
    wait, by_preempting = waits[best]
    if wait == 0.0 and not by_preempting:
        return types  # the best type is free: the policy's order decides (its plan)
    cut = eta[best] * SLACK
    for t in options:
        if t not in waits and runs[t] <= cut:
            weigh(t)
    return [t for t in options if t in eta and eta[t] <= cut]
