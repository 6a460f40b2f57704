"""Gavel (OSDI '20), heterogeneity-aware max-min fairness — an LP-free approximation.

Every round (6 minutes, as in Gavel) all active jobs are re-planned: jobs are ranked by the
normalised throughput they have received so far (progress per second since submission over
their best speed; least served first) and admitted in that order while GPUs remain; the
admitted jobs are then given GPU types by comparative advantage — jobs that gain most from fast
GPUs get them first. Running jobs left out of the plan, or planned on another type, are
suspended: they save their checkpoint as their lease ends (keeping all their progress) and free
their GPUs once saved; planned pending jobs start on their planned type. Gavel ignores tiers.
"""

from __future__ import annotations

from gpu_arbiter.domain import Job, JobState
from gpu_arbiter.engine.policy import Policy

ROUND_S = 360.0


class GavelPolicy(Policy):
    name = "gavel"
    quotas = False
    preemption = False
    backfill = "greedy"
    elastic = False
    heterogeneity = "any"
    tiers = False
    incremental = False
    suspend_saves = True

    def __init__(self) -> None:
        self.plan: dict[str, str] = {}
        self.order: list[Job] = []
        self.next_round = 0.0

    def group_key(self, job: Job) -> int:
        return 0

    def before_cycle(self, sched, now: float) -> None:
        if now < self.next_round:
            return
        self.next_round = now + ROUND_S
        for job in sched.running.values():
            job.advance(now)
        active = list(sched.running.values()) + [
            j for j in sched.queue.jobs() if j.state == JobState.PENDING
        ]
        best = {j.id: max(sched.speed(j, t) for t in sched.types_by_speed(j)) for j in active}

        def served(j: Job) -> float:
            age = max(1.0, now - j.spec.submit_s)
            return j.progress_s / age / best[j.id]

        ranked = sorted(active, key=lambda j: (served(j), j.spec.submit_s, j.seq))
        left = dict(sched.index.type_total)
        for node, is_down in enumerate(sched.index.down):
            if is_down:
                left[sched.index.node_type[node]] -= sched.index.size[node]
        admitted = []
        total = sum(left.values())
        for j in ranked:
            if j.spec.gpus <= total:
                admitted.append(j)
                total -= j.spec.gpus
        plan: dict[str, str] = {}

        def advantage(j: Job) -> float:
            speeds = [sched.speed(j, t) for t in sched.types_by_speed(j)]
            return speeds[0] / speeds[-1]

        for j in sorted(admitted, key=lambda j: (-advantage(j), j.seq)):
            for t in sched.types_by_speed(j):
                if left.get(t, 0) >= j.spec.gpus:
                    plan[j.id] = t
                    left[t] -= j.spec.gpus
                    break
        self.plan = plan
        self.order = [j for j in ranked if j.id in plan]
        for job in list(sched.running.values()):
            planned = plan.get(job.id)
            if planned != job.allocation.gpu_type:
                sched.preempt(job, now, "gavel round: not in this round's allocation")

    def ordered(self, sched, now):
        """This round's plan first, then anyone else while GPUs are idle until the next round."""
        yield from (j for j in self.order if j.state == JobState.PENDING)
        yield from (j for j in sched.queue.by_rank() if j.id not in self.plan)

    def candidate_types(self, sched, job: Job) -> list[str]:
        # The planned type first; the others after it, so a job the plan put on a type where it
        # cannot be placed (power, topology) still runs instead of being re-planned there forever.
        types = sched.types_by_speed(job)
        planned = self.plan.get(job.id)
        return [planned] + [t for t in types if t != planned] if planned else types

    def next_wakeup(self, sched, now: float) -> float | None:
        if not len(sched.queue) and not sched.running:
            return None
        return self.next_round if self.next_round > now else now + ROUND_S
