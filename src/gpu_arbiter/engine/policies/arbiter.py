"""Arbiter's policy: every step on.

Tiers first; within a tier, teams by weighted dominant share (S4). Placement packs (S5, S6);
a blocked job preempts by tier or reclaims borrowed capacity (S1, S2), shrinking elastic jobs
before stopping anyone (S8); otherwise it gets an EASY reservation that backfill honours (S6).
Flexible jobs move to a slower GPU type when the fast one is wanted by jobs pinned to it (S7).

When pending jobs accept several GPU types and want more of the fast ones than are free, who
gets the fast GPUs is decided by comparative advantage (as in Gavel): each cycle the pending
jobs are planned onto the free GPUs in order of how much faster their fastest type is than their
slowest, so a job that gains 6x from a V100 gets it before one that gains 2x. The plan only
picks the type a job tries first; the order in which jobs start (tier, fair share) is unchanged.

A preemption that would throw away a victim's uncheckpointed work is weighed against the
preemptor's expected wait (`Scheduler._worth_the_lost_work`), and a plan whose victims stop at
once on another accepted type is preferred to one that waits out a tier-2 grace.
"""

from __future__ import annotations

from itertools import islice

from gpu_arbiter.domain import Job, JobState
from gpu_arbiter.engine.policy import Policy

PLAN_DEPTH = 256  # pending jobs considered for the comparative-advantage plan per cycle


class ArbiterPolicy(Policy):
    name = "arbiter"
    weigh_lost_work = True

    def __init__(self) -> None:
        self.plan: dict[str, str] = {}

    def before_cycle(self, sched, now: float) -> None:
        self.plan = {}
        if len(sched.index.type_total) < 2 or not len(sched.queue) or not sched.index.total_free:
            return  # nothing to plan onto
        # The head of the queue only: deep jobs cannot get GPUs this cycle anyway.
        pending = [
            j
            for j in islice(sched.queue.in_group_order(), PLAN_DEPTH)
            if j.state == JobState.PENDING and len(sched.types_by_speed(j)) > 1
        ]
        left = dict(sched.index.type_free)

        def advantage(j: Job) -> float:
            types = sched.types_by_speed(j)
            return sched.speed(j, types[0]) / sched.speed(j, types[-1])

        for j in sorted(pending, key=lambda j: (-advantage(j), j.tier, j.seq)):
            n = j.spec.elastic_range[0]
            for t in sched.types_by_speed(j):
                if left.get(t, 0) >= n:
                    self.plan[j.id] = t
                    left[t] -= n
                    break

    def candidate_types(self, sched, job: Job) -> list[str]:
        types = sched.types_by_speed(job)
        planned = self.plan.get(job.id)
        if planned is None or planned == types[0]:
            return types
        return [planned] + [t for t in types if t != planned]
