"""Backfill reservations (EASY, over `engine.backfill`): what a blocked job holds back, and how
a reservation binds the jobs walked after it, both their starts and their preemptions (S6)."""

from __future__ import annotations

from gpu_arbiter.domain import MILLI, Job, JobKind, Tier
from gpu_arbiter.engine.backfill import Reservation, expected_free_at, node_free_at, reserve
from gpu_arbiter.engine.context import CycleContext

WHOLE_TYPE = -1  # no node: a count reservation bars the whole type (`_reserved_node`)


class Reservations:
    """The reservations of a walk (mixed into `Scheduler`)."""

    def _reservation_for(self, job: Job, gpu_type: str, n: int, now: float) -> Reservation:
        """The EASY reservation of a blocked job. When enough GPUs of the type are free by count
        and the job still could not be placed (topology, rack power), holding them back does
        not start it: it waits for a node to drain, not for a count. A policy that does not
        `reserve_fragmented` then lets everything backfill on the type (the reservation only
        keeps the type from being reserved by a later job). A policy that `reserve_nodes`
        holds one node for a gang that must fit in one (`_node_reservation`)."""
        if self.policy.reserve_nodes and 1 < n <= self.index.max_size[gpu_type]:
            res = self._node_reservation(job, gpu_type, n, now)
            if res is not None:
                return res
        free = self.index.type_free[gpu_type]
        if free >= n and not self.policy.reserve_fragmented:
            return Reservation(job.id, gpu_type, n, now, self.index.type_total[gpu_type])
        ends = ((end, self.running[j].gpus_held) for end, _, j in self.ends_by_type[gpu_type])
        return reserve(job, gpu_type, n, free, ends, now)

    def _node_reservation(self, job: Job, gpu_type: str, n: int, now: float) -> Reservation | None:
        """A reservation of the node of the type expected to have `n` GPUs free first, by the
        walltime estimates of the whole-GPU jobs on it (a shared GPU frees only when all its
        sharers have ended: it is not counted), or None if no node is expected to. Count-based
        EASY holds every GPU of the type that frees before the gang's start although the gang
        needs one node, so small jobs that keep every node partly used make the gang wait
        while jobs barred from the held GPUs go to slower types."""
        index = self.index

        def free(node: int) -> int:
            """-1 for a node that can never hold the job, or whose room now did not take it
            (rack power, NVLink domains: ends there may not help either)."""
            has = index.free[node]
            return -1 if index.size[node] < n or index.down[node] or has >= n else has

        running = self.running
        ends = (
            (end, running[j].allocation)
            for end, _, j in self.ends_by_type[gpu_type]
            if running[j].spec.gpu_milli >= MILLI
        )
        found = node_free_at(n, free, ends, now)
        if found is None:
            return None
        node, shadow, extra = found
        return Reservation(job.id, gpu_type, n, shadow, extra, node)

    def _reservation_over(self, job: Job, gpu_type: str, ctx: CycleContext) -> Reservation | None:
        """The backfill reservation the job must not delay on the type. A walk goes tier by
        tier, so a reservation is only ever made ahead of lower tiers; but a cycle that looks
        at newcomers only reuses the last walk's reservations, and a tier-1 newcomer must not
        wait behind the reservation of a tier-2 job it would have been walked before. Nor is a
        job bound by the reservation of one its policy lets it pass
        (`Policy.passes_reservation`)."""
        res = ctx.reservations.get(gpu_type)
        if res is None:
            return None
        holder = self.jobs.get(res.job_id)
        if holder is not None and (
            holder.tier > job.tier or self.policy.passes_reservation(ctx.view, job, holder)
        ):
            return None
        return res

    def _reserved_node(
        self, job: Job, gpu_type: str, n: int, now: float, ctx: CycleContext
    ) -> int | None:
        """How the backfill reservation on the type bounds a preemption for `n` GPUs (S6): a
        job walked after the holder may no more delay the reserved start by stopping jobs
        than by taking free GPUs (`_attempt`), unless it ends before the shadow time or fits
        in the spare GPUs. None: no bound; a node: the one held, to stay off; `WHOLE_TYPE`:
        a count reservation, which bars the type. Not bound: a tier-1 job, which stops lower
        tiers within a cycle (S1), also where it borrows at tier 2 (it keeps tier 1's
        precedence and queueing target), and an inference surge (S9). Unbound, a small job
        could stop victims on the very node a gang holds and run there for days, and the gang
        with everyone behind it would wait as long."""
        if job.tier == Tier.CORE or job.borrows_at_tier2 or job.spec.kind == JobKind.INFERENCE:
            return None
        res = self._reservation_over(job, gpu_type, ctx)
        if res is None or self._backfill_ok(res, job, gpu_type, n, now):
            return None
        return WHOLE_TYPE if res.node is None else res.node

    def shadow_time(self, gpu_type: str, n: int, now: float, ctx: CycleContext) -> float:
        """When `n` GPUs of the type are expected to be free for a job that could not be placed
        there, by the running jobs' walltime estimates (EASY, `engine.backfill.reserve`);
        remembered while the type is unchanged. Free GPUs that already suffice in number are
        held by topology, power or a reservation: then only GPUs running jobs release count
        (the count alone would promise a start "now" to a gang the free GPUs cannot hold)."""
        key = (gpu_type, n)
        cached = ctx.shadows.get(key)
        if cached is None or cached[0] != self._epoch[gpu_type]:
            ends = ((e, self.running[j].gpus_held) for e, _, j in self.ends_by_type[gpu_type])
            free = self.index.type_free[gpu_type]
            shadow = expected_free_at(n, free if free < n else 0, ends, now)[0]
            cached = ctx.shadows[key] = (self._epoch[gpu_type], shadow)
        return cached[1]
