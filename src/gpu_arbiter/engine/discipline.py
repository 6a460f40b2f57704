"""Arbiter's discipline within a tier: who goes first, and whom a job may suspend for it.

Tiers, notice, quotas and borrowing (S1, S2) come first and are not this module's; below them
tier-3 work is time-shared by least attained service, with walltime estimates as a tie-break
and a check:

1. A job's priority queue is set by the GPU-time it has attained (`THRESHOLDS`, Tiresias'
   discretised 2D-LAS): the less service, the higher the queue, as least-attained-service
   does best when job sizes are unknown and heavy-tailed.
2. Within a team, pending jobs go by queue, then by the GPU-time their walltime estimate says is
   left (shortest remaining first; jobs without an estimate after those with one), then by
   submission; teams are served by fair share (S4).
3. A tier-3 job may suspend a running tier-3 job of a strictly lower-priority queue, which is
   asked to save its checkpoint and is queued again with all its progress (time-sharing).
4. Not where both have walltime estimates and the victim's remaining GPU-time is in no higher
   power-of-two band than the job's: shortest remaining first would keep it running.
5. It suspends only its own team's jobs, or those of a team served at least as well as its own
   (S4), and beyond its team's quota only jobs on borrowed capacity (S2).
6. A blocked tier-3 job's backfill reservation does not hold GPUs from a job that outranks it
   by rules 3 and 4 (`ArbiterPolicy.passes_reservation`): least attained service puts it first.

A pending job attains nothing, so its queue, and the queue's order, is fixed while it waits; a
running job's queue rises with the service it attains, the only change with time that can give
a preemptor a victim (`ArbiterPolicy.note_time`).
"""

from __future__ import annotations

import bisect
import math

from gpu_arbiter.domain import Job, Tier
from gpu_arbiter.engine.memo import run_band

# Queue boundaries in GPU-seconds: below 1 GPU-hour, below 10 GPU-hours, the rest (Tiresias').
THRESHOLDS = (3600.0, 36_000.0)


def remaining_estimate(job: Job, now: float | None = None) -> float | None:
    """GPU-seconds (reference) its walltime estimate says are left at `now` (default: its
    progress as last brought up to date), or None without an estimate."""
    spec = job.spec
    if spec.walltime_s is None:
        return None
    done = job.progress_s if now is None else job.progress_at(now)
    return spec.walltime_s * max(0.0, 1 - done / spec.duration_s) * spec.gpus


def attained_at(job: Job, now: float) -> float:
    """GPU-seconds the job has received by `now` (changes nothing)."""
    extra = job.gpu_share * (now - job.updated_at) if now > job.updated_at else 0.0
    return job.attained_gpu_s + extra


def queue_of(job: Job, now: float | None = None) -> int:
    """Rule 1: the job's priority queue by the GPU-time it attained by `now` (default: as last
    brought up to date), 0 the highest."""
    attained = job.attained_gpu_s if now is None else attained_at(job, now)
    return bisect.bisect_right(THRESHOLDS, attained)


def rank_key(job: Job) -> tuple:
    """Rule 2: a pending job's place in its team's queue."""
    left = remaining_estimate(job)
    return (queue_of(job), math.inf if left is None else left, job.spec.submit_s)


def remaining_band(job: Job, now: float | None = None) -> int | None:
    """The power-of-two band of the job's remaining estimate (`remaining_estimate`), or None."""
    left = remaining_estimate(job, now)
    return None if left is None else run_band(left)


Standing = tuple[int, int | None]  # (queue, remaining band): what rules 3 and 4 compare


def standing(job: Job, now: float | None = None) -> Standing:
    """The job's queue and remaining band at `now` (default: as last brought up to date)."""
    return (queue_of(job, now), remaining_band(job, now))


def standing_until(job: Job, now: float) -> tuple[Standing, float]:
    """The running job's `standing` at `now`, and the earliest time it may change: its attained
    GPU-time reaching the next queue's boundary, or its remaining estimate, drawn down at its
    current rate, leaving its band. (A restore's stall only delays the latter: then it is
    looked at again.)"""
    attained = attained_at(job, now)
    q = bisect.bisect_right(THRESHOLDS, attained)
    left = remaining_estimate(job, now)
    band = None if left is None else run_band(left)
    share = job.gpu_share
    if not share:
        return (q, band), now
    until = now + (THRESHOLDS[q] - attained) / share if q < len(THRESHOLDS) else math.inf
    if left is not None and left >= 2.0:
        spec = job.spec
        drain = spec.walltime_s / spec.duration_s * spec.gpus * job.rate  # GPU-s per second
        if drain > 0:
            until = min(until, now + (left - 2.0**band) / drain)
    return (q, band), until


def beats(mine: Standing, theirs: Standing) -> bool:
    """Rules 3 and 4 on standings: a strictly lower-priority queue, and no band at least as
    low where both have estimates."""
    if theirs[0] <= mine[0]:
        return False
    return mine[1] is None or theirs[1] is None or theirs[1] > mine[1]


def may_beat(mine: Standing) -> bool:
    """Whether a job of this standing `beats` any standing at all: not from the last queue."""
    return mine[0] < len(THRESHOLDS)


def outranks(job: Job, victim: Job, now: float) -> bool:
    """Rules 3 and 4: whether pending tier-3 `job` may suspend tier-3 `victim` at `now`."""
    return job.tier == victim.tier == Tier.EXPLORATORY and beats(
        standing(job), standing(victim, now)
    )


def may_displace(fair_share, job: Job, victim: Job, within_quota: bool) -> bool:
    """Rule 5: whether `job` may take `victim`'s GPUs by team: its own team's, or a team served
    at least as well (`fair_share(team)`), and, beyond its quota, only a borrower (a borrower
    taking a guaranteed job's GPUs would be reclaimed at once, and the same jobs stopped again
    and again)."""
    return displaces(fair_share, job.team, victim.team, victim.borrowed, within_quota)


def displaces(fair_share, team: str, owner: str, borrowed: bool, within_quota: bool) -> bool:
    """Rule 5 by teams: whether a job of `team` may take GPUs a job of `owner` holds
    (`borrowed`: on borrowed capacity), as `may_displace` says."""
    if owner == team:
        return True
    if not (within_quota or borrowed):
        return False
    return fair_share(owner) >= fair_share(team)
