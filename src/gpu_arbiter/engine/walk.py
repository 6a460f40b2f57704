"""One pending job's try: place -> preempt -> reserve.

Every accepted GPU type (in the policy's order) and start size is tried within the backfill
reservations (placement); then a preemption plan (`engine.preemption`); a job that found
neither is noted blocked on its types, reserves the GPUs of the type it waits for (EASY) and
is remembered as blocked until something it looked at changes (`engine.memo`). A tier-1 job
beyond its guarantee and the pool gets a second try at tier 2 (`_borrows_at_tier2`)."""

from __future__ import annotations

import math

from gpu_arbiter.domain import MILLI, Allocation, Job, JobState, Tier
from gpu_arbiter.engine.backfill import Reservation, fits_before, may_take
from gpu_arbiter.engine.context import CycleContext
from gpu_arbiter.engine.elastic import start_sizes
from gpu_arbiter.engine.placement import Request, place
from gpu_arbiter.engine.policy import Backfill, Heterogeneity


class Walk:
    """A pending job's try (mixed into `Scheduler`)."""

    def _candidate_types(self, job: Job, ctx: CycleContext) -> list[str]:
        if self._fixed_types:
            return job.types
        types = self.policy.candidate_types(ctx.view, job)
        if self.policy.heterogeneity != Heterogeneity.SMART or len(types) < 2:
            return types
        fastest, n = types[0], job.spec.elastic_range[0]
        free, queue, tier = self.index.type_free, self.queue, int(job.tier)

        def spare(t: str) -> int:  # free GPUs of the type left after the job and pinned jobs
            return free[t] - n - queue.pinned_at_or_above(t, tier)

        if spare(fastest) >= 0:
            return types
        # S7: the fastest type is wanted by jobs that cannot run elsewhere; a flexible job
        # starts now on a slower type that is still fast enough rather than take it from them,
        # but not on one that pinned jobs want too, and among equally fast ones on the roomiest
        # (not the next by name, which flexible jobs would fill for days before pinned ones).
        # Only pinned jobs of its tier or a higher one count: a lower tier comes after it (S1),
        # and a tier-1 job that gave way would run on the slower type for good.
        floor = self.cfg.slower_type_min_speed * self.speed(job, fastest)
        speed = {t: self.speed(job, t) for t in types[1:]}
        slower = sorted(
            (t for t in types[1:] if speed[t] >= floor and spare(t) >= 0),
            key=lambda t: (-speed[t], -spare(t)),
        )
        return slower + [t for t in types if t not in slower]

    def _try_start(self, job: Job, now: float, ctx: CycleContext) -> bool:
        blocked = self._blocked.get(job.id)
        if blocked is not None and self._still_blocked(job, blocked, now, ctx):
            return False
        self.last_try[job.id] = now
        ctx.timely = False
        ctx.wait_on = ctx.kept_for = None
        failure = self._attempt(job, now, ctx)
        if failure is None:
            return True
        types, n, hopeless = failure
        if self._borrows_at_tier2(job, n):
            wait_on = ctx.wait_on
            job.tier, job.borrows_at_tier2 = Tier.BUSINESS, True
            if self._attempt(job, now, ctx) is None:
                return True
            job.tier, job.borrows_at_tier2 = Tier.CORE, False
            ctx.wait_on = wait_on  # what the tier-1 try waits for; `timely` keeps both tries'
            hopeless = None  # the tier-1 try's stamp does not watch what tier 2 may preempt
        self._failed(job, types, n, now, ctx, hopeless)
        return False

    def _borrows_at_tier2(self, job: Job, n: int) -> bool:
        """Whether a tier-1 job that found no start gets a second try at tier 2 (S2): on some
        accepted type its team's guarantee and what is left of the pool cannot give it `n` GPUs
        now. On that try it has a tier-2 job's rights (idle GPUs, tier-3 victims), yet is queued
        and ordered at tier 1, keeps tier 1's precedence over tier-2 borrowers of other teams
        (`Policy.may_preempt`) and tier 1's queueing target (`engine.typechoice`). So it is
        never worse off than a tier-2 job of its team, also while other teams' tier-1 jobs
        fill the pool."""
        if job.tier != Tier.CORE or not self.policy.quotas or not self.cfg.tier1_borrows_at_tier2:
            return False  # (without quotas every type is `admissible`)
        return not all(self.admissible(job, t, n) for t in job.types)

    def _attempt(self, job: Job, now: float, ctx: CycleContext) -> tuple | None:
        """One try at the job's current tier: None if it started (or preempted for a start),
        else (the types tried, the smallest size, the `_hopeless` stamp or None) for
        `_failed`."""
        ctx.scopes.clear()
        spec = job.spec
        sizes = start_sizes(spec, self.policy.elastic)
        hopeless = self._hopeless(job, sizes[-1], ctx)
        if hopeless is not None:
            types = self._types_when_hopeless(job, sizes[-1], ctx)
            if types is not None:
                return types, sizes[-1], hopeless
        types = self._candidate_types(job, ctx)
        if len(types) < len(job.types):
            ctx.timely = True  # the policy held some types back, for now (engine.typechoice)
        if hopeless is not None:
            return types, sizes[-1], hopeless
        free = self.index.type_free
        # Nothing to place on when no accepted type has enough whole free GPUs (the common case
        # for a job at the back of a busy queue): go straight to preemption and reservation.
        placeable = spec.gpu_milli < MILLI or any(free[t] >= sizes[-1] for t in types)
        for t in types if placeable else ():
            for n in sizes:
                if not self.admissible(job, t, n):
                    continue
                res = self._reservation_over(job, t, ctx)
                off_limits = res is not None and not self._backfill_ok(res, job, t, n, now)
                if off_limits:
                    ctx.kept_for = res.job_id
                    if res.node is None:
                        continue
                held = res.node if off_limits else self._held_node(job, t, ctx)
                sig = (
                    t,
                    spec.tp_size,
                    spec.max_racks,
                    spec.power_profile,
                    spec.data_locality,
                    spec.gpu_milli,
                    held if off_limits else None,
                )
                stamp = self._stamp(t)
                if self._place_failed.failed(sig, n, stamp):
                    continue
                alloc = self._find(job, t, n, held, off_limits)
                if alloc is None:
                    self._place_failed.record(sig, n, stamp)
                    continue
                if not self._power_stagger_ok(job, alloc, ctx):
                    continue
                self._book_spare(res, job, alloc, now)
                self.state.start(job, alloc, now)
                return None
        if self.policy.preemption and self._try_preempt(job, types, sizes[-1], now, ctx):
            return None
        return types, sizes[-1], None

    def _failed(
        self,
        job: Job,
        types: list[str],
        n: int,
        now: float,
        ctx: CycleContext,
        hopeless: tuple | None = None,
    ) -> None:
        """A try found no start: note the types it is blocked on, reserve the GPUs of the type
        it waits for (its fastest, unless the preemption step chose another) if none are
        reserved there (or stop the walk, for strict order) and remember the failure unless
        time alone can change it (by what it was blocked on, or by what can end its `hopeless`
        wait). What it found is noted for `why_pending` (`engine.waiting`)."""
        self._waits[job.id] = (n, ctx.kept_for, hopeless is not None)
        self._note_blocked(types, n, ctx)
        if self.policy.backfill == Backfill.NONE:
            ctx.stop = True
        elif self._reserves and types:
            t = ctx.wait_on or types[0]
            if t not in ctx.reservations:
                ctx.reservations[t] = self._reservation_for(job, t, n, now)
        if self.policy.incremental and not ctx.timely:
            self._blocked[job.id] = (
                hopeless
                or self._barred_stamp(job, types, n, now, ctx)
                or self._blocked_stamp(job, now)
            )

    def _note_blocked(self, types: list[str], n: int, ctx: CycleContext) -> None:
        """A job wanting `n` GPUs is blocked on these types: they count as stranded where
        enough GPUs are free, and its GPUs as wanted ahead of anybody walked after it (which
        only the preemption step reads, `_wait_elsewhere`)."""
        free = self.index.type_free
        ctx.blocked_types.update(types)
        for t in types:
            if free[t] >= n:
                ctx.stranded_types.add(t)
        if self.policy.preemption:
            waiting = ctx.waiting
            for t in types:
                waiting[t] = waiting.get(t, 0) + n

    def admissible(self, job: Job, gpu_type: str, n: int) -> bool:
        """Whether the job may hold `n` GPUs of the type now, by its quota (S2): tier-1 jobs
        cannot be preempted, so they may borrow only from the unowned pool (beyond it, a tier-1
        job may borrow at tier 2: `_borrows_at_tier2`)."""
        if not self.policy.quotas or job.tier != Tier.CORE:
            return True
        return self.quota.tier1_fits(job.team, gpu_type, n * job.spec.gpu_milli)

    def _backfill_ok(self, res: Reservation, job: Job, gpu_type: str, n: int, now: float) -> bool:
        if res.job_id == job.id:
            return True
        return may_take(res, job.id, n, self.est_runtime(job, gpu_type, n), now)

    def est_runtime(self, job: Job, gpu_type: str, n: int) -> float:
        if job.spec.walltime_s is None:
            return math.inf
        rate = self.speed(job, gpu_type) * n / job.spec.gpus
        done = job.progress_s / job.spec.duration_s
        return job.spec.walltime_s * (1 - done) / rate

    def _book_spare(self, res: Reservation | None, job: Job, alloc: Allocation, now: float) -> None:
        """The job starts (or is held) on `alloc`: where that takes GPUs the reservation counts
        on, book the spare GPUs it uses past the shadow time (`fits_before`)."""
        if res is not None and res.covers(alloc):
            fits_before(res, alloc.gpus, self.est_runtime(job, alloc.gpu_type, alloc.gpus), now)

    def _request(self, job: Job, gpu_type: str, n: int) -> Request:
        s = job.spec
        return Request(gpu_type, n, s.tp_size, s.max_racks, s.power_profile, s.data_locality)

    def _power_stagger_ok(self, job: Job, alloc: Allocation, ctx: CycleContext) -> bool:
        """S10: start few high-power jobs per rack in one cycle so their peaks are staggered."""
        if job.spec.power_profile != "high":
            return True
        racks = {self.index.node_rack[n] for n in alloc.nodes}
        limit = self.cfg.high_power_starts_per_rack
        if any(ctx.high_power.get(r, 0) >= limit for r in racks):
            ctx.retry = ctx.timely = True
            return False
        for r in racks:
            ctx.high_power[r] = ctx.high_power.get(r, 0) + 1
        return True

    def _find(
        self, job: Job, gpu_type: str, n: int, held: int | None = None, strict: bool = False
    ) -> Allocation | None:
        """Where `n` GPUs of `gpu_type` for `job` would go now, or None. A fractional job
        (S11) goes best-fit onto an already shared GPU before it opens a free one. Node `held`
        (by another job's reservation, `_held_node`) is taken only when no other node will do,
        and never when `strict`."""
        milli = job.spec.gpu_milli
        if milli < MILLI:
            found = self.shared.find(gpu_type, milli)
            if found is not None:
                return found
        req, strategy = self._request(job, gpu_type, n), self.policy.placement
        if held is not None:
            alloc = place(self.index, req, strategy, avoid=held)
            if alloc is not None or strict:
                return alloc
        return place(self.index, req, strategy)

    def _held_node(self, job: Job, gpu_type: str, ctx: CycleContext) -> int | None:
        """The node of the type that another job's reservation holds (this walk's, else the
        last walk's, which jobs walked before its holder never see: a tier-1 pod stays off
        the node a tier-2 gang waits on where another node has room), if any."""
        res = ctx.reservations.get(gpu_type) or self._reservations.get(gpu_type)
        if res is None or res.node is None or res.job_id == job.id:
            return None
        holder = self.jobs.get(res.job_id)
        return res.node if holder is not None and holder.state == JobState.PENDING else None
