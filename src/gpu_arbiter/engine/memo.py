"""Searches that failed, remembered across cycles while what they looked at is unchanged.

Most pending jobs of a busy cluster fail the same placement or preemption search cycle after
cycle. A search's outcome depends only on the state of its GPU type (and of the types sharing
its racks' power caps), so the scheduler stamps each GPU type with an epoch that every start,
stop, resize, hold, fault and repair on it bumps; a failure recorded under a stamp stands until
the stamp changes. A failure at `n` GPUs also stands for any larger request with the same
signature (shape, tier, team, quota standing).

A job whose try failed is stamped (`_blocked_stamp`) and is not tried again until the stamp
changes; a job that can neither be placed nor preempt for (`_hopeless`) is stamped with only
what can end its wait (releases, starts of possible victims), the cheap check most jobs of a
long queue get every cycle. A job that backfill reservations keep off every type with room for
it (`_barred_stamp`) is stamped with no epoch: at each look, a few comparisons with the walk's
reservations and the free counts (`_still_barred`) tell whether its try would fail again.
Epochs would miss a reservation that changed with nothing started or stopped on its type (its
holder started on another type, and the reservation the next job made in its place bars less).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field

from gpu_arbiter.domain import MILLI, Job, Tier
from gpu_arbiter.engine.context import CycleContext
from gpu_arbiter.engine.elastic import start_sizes

TIERS = (1, 2, 3)
# Starts are counted by the run their walltime estimate gives them: band b counts those expected
# to run at least 2**b seconds (the last band, about 68 years and beyond, those without one).
RUN_BANDS = 32
HOPELESS = "hopeless"  # marks a blocked stamp made by `Stamps._hopeless`
BARRED = "barred"  # marks a blocked stamp made by `Stamps._barred_stamp`
QUOTA = "quota"  # a `_hopeless` job's wait on a type where only its quota can give it victims
NOT_STARTED = (None, 0)  # no job started on a type yet (`Stamps._starts_at`)


def run_band(run: float) -> int:
    """The band of `RUN_BANDS` a run of `run` seconds falls in: the largest b with
    2**b <= `run` (0 below 2 seconds, the last band at most)."""
    if run >= 2.0 ** (RUN_BANDS - 1):
        return RUN_BANDS - 1
    return math.frexp(run)[1] - 1 if run >= 2.0 else 0


class FailureMemo:
    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[Hashable, tuple[int, Hashable]] = {}

    def failed(self, sig: Hashable, n: int, stamp: Hashable) -> bool:
        entry = self._entries.get(sig)
        return entry is not None and entry[1] == stamp and entry[0] <= n

    def record(self, sig: Hashable, n: int, stamp: Hashable) -> None:
        entry = self._entries.get(sig)
        if entry is not None and entry[1] == stamp:
            n = min(n, entry[0])
        self._entries[sig] = (n, stamp)


@dataclass(slots=True)
class PendingNotes:
    """What the walk noted about each pending job: the stamp of its last failed try
    (`_blocked_stamp` or `_hopeless`), when it last had a full try, and what that try found
    (`engine.waiting`). A start ends all of them, a hold the stamp (`engine.state`)."""

    blocked: dict[str, tuple] = field(default_factory=dict)
    last_try: dict[str, float] = field(default_factory=dict)
    waits: dict[str, tuple] = field(default_factory=dict)

    def forget(self, job_id: str) -> None:
        self.blocked.pop(job_id, None)
        self.last_try.pop(job_id, None)
        self.waits.pop(job_id, None)


class Stamps:
    """Blocked and hopeless stamps over the state's counters of change (mixed into
    `Scheduler`)."""

    def _hopeless(self, job: Job, n: int, ctx: CycleContext) -> tuple | None:
        """Whether the job can neither be placed (no accepted type has `n` whole free GPUs) nor
        preempt for (nothing of a tier it may take from runs on them): then a try fails on
        every type, whatever the policy offers, the reservations and the failure memos say.
        The common case for a tier-3 job over its quota in a busy queue, so it costs a look at
        the free counts and quota books only. Returns None, or what can end the wait (for
        `_still_hopeless`), per accepted type: the team's releases there (which can put it
        back within its quota, so it may reclaim), for a tier-1 job any GPUs freed there (the
        pool may have room again), as for a job whose victims there are too few for the GPUs
        it misses (`Policy.victims_too_few`: fewer missing may make them enough), and, where
        the job may take GPUs from some tier but nobody of it runs (or nobody the policy lets
        it stop), jobs of that tier started there that
        are expected to run long enough to be its victims (`Policy.victim_min_run`), and
        running jobs there that became victims by a policy's order changing with time
        (`Scheduler.reranked`); where the job, beyond its team's quota there, may take from no
        tier at all (`Policy.victim_tiers`), nothing but being back within its quota (`QUOTA`:
        no start, rise or other team's release can give it a victim); for a policy that
        neither preempts nor has quotas, nothing but GPUs freed in number (no wake list).
        Placement is only ever refused here for too few free GPUs, so power and topology need
        no stamp."""
        if job.spec.gpu_milli < MILLI:
            return None  # may fit on a GPU already shared
        free = self.index.type_free
        if not self.policy.preemption and not self.policy.quotas:
            # Nothing to take from and no quota to get back within: only GPUs freed in
            # number end the wait.
            for t in job.types:
                if free[t] >= n:
                    return None
            return (HOPELESS, int(job.tier), n, None)
        wake = []
        for t in job.types:
            if free[t] >= n:
                return None
            starts = None
            every = job.tier == Tier.CORE
            scope = self._preempt_scope(job, t, n, ctx)
            if scope is not None:
                within, has_victims = scope
                if has_victims:
                    return None
                tiers = self.policy.victim_tiers(job, within)
                if not tiers and not within and not every:
                    # Beyond its quota it may take from nobody here, whoever runs or starts:
                    # only coming back within its quota can give it victims.
                    wake.append(QUOTA)
                    continue
                if tiers:
                    band = run_band(self.policy.victim_min_run(ctx.view, job, t, within))
                    starts = (tiers, band, self._starts_of(t, tiers, band))
                every = every or self.policy.victims_too_few(ctx.view, job, t, within)
            wake.append(((every, self._releases(job, t, every)), starts, self.state.reranks[t]))
        return (HOPELESS, int(job.tier), n, tuple(wake))

    def _types_when_hopeless(self, job: Job, n: int, ctx: CycleContext) -> list[str] | None:
        """What `_candidate_types` gives a `_hopeless` job (`Policy.types_when_hopeless`), or
        None where only it can say. No accepted type has `n` GPUs free, so the smart order
        keeps the policy's too, as long as both ask about the same, smallest size."""
        if n != job.spec.elastic_range[0]:
            return None
        return self.policy.types_when_hopeless(ctx.view, job)

    def _releases(self, job: Job, gpu_type: str, every: bool) -> int:
        """The release counter a `_hopeless` job watches on the type: its team's (the way back
        within quota) or, with `every`, every release there."""
        if every:
            return self._freed[gpu_type]
        return self.quota.releases.get((job.team, gpu_type), 0)

    def _still_hopeless(self, job: Job, stamp: tuple, types: list[str]) -> bool:
        """Whether nothing that can end a `_hopeless` wait happened: still too few free GPUs on
        every accepted type (`types`), and no release or start its stamp watches. The check
        most jobs of a long queue get every cycle, so `_releases` is spelled out here."""
        _, tier, n, wake = stamp
        if job.tier != tier:
            return False
        free = self.index.type_free
        if wake is None:  # it watches free GPUs only (`_hopeless`)
            for t in types:
                if free[t] >= n:
                    return False
            return True
        team, quota = job.team, self.quota
        releases, freed, reranked = quota.releases, self._freed, self.state.reranks
        for t, watch in zip(types, wake, strict=True):
            if free[t] >= n:
                return False
            if watch is QUOTA:
                if quota.within(team, t, n * job.spec.gpu_milli, tier):
                    return False
                continue
            (every, seen), starts, reranks = watch
            if (freed[t] if every else releases.get((team, t), 0)) != seen:
                return False
            if reranked[t] != reranks:
                return False
            if starts is not None and self._starts_of(t, starts[0], starts[1]) != starts[2]:
                return False
        return True

    def _blocked_stamp(self, job: Job, now: float) -> tuple:
        """Everything a failed `_try_start` of the job looked at that can change without time
        passing: its tier and, per accepted type (and the types sharing its racks' power), every
        start, stop, resize, hold, fault and repair; jobs started at `now` count once `now` has
        passed (they are no victims in their first cycle)."""
        near, starts_now = self._near_epoch, self._starts_now
        stamp: list = [int(job.tier)]
        for t in job.types:
            at, k = starts_now.get(t, NOT_STARTED)
            stamp.append((near[t], k if at == now else 0))  # `_starts_at`, spelled out
        return tuple(stamp)

    def _still_blocked(self, job: Job, stamp: tuple, now: float, ctx: CycleContext) -> bool:
        """Whether the job failed to start (or preempt) under the same state before: then it
        fails again, as every rule it went through depends only on that state or, for backfill,
        only gets stricter with time. Decisions that can change with time alone (lost work
        weighed against a wait, a policy holding types back, a staggered start) are never
        remembered. It still counts as blocked on its types, and a type without a reservation
        yet gets its reservation from a full look or, for a hopeless job, on the one type its
        full look would reserve (`_failed`), from here: its try would fail the same way."""
        types = job.types
        reservations = ctx.reservations
        unreserved = self._reserves and not all(map(reservations.__contains__, types))
        if stamp[0] == HOPELESS:
            n = stamp[2]
            if not self._still_hopeless(job, stamp, types):
                return False
            if not unreserved and not self.policy.preemption:
                # No type has `n` GPUs free: blocked on all, stranded on none.
                ctx.blocked_types.update(types)
                return True
            if unreserved:
                # A hopeless job's failed try reserves its first candidate type only: the
                # others may stay unreserved for good, and looking again would not change that.
                tried = self._types_when_hopeless(job, n, ctx)
                if tried is None:
                    return False
                if tried[0] not in reservations:
                    reservations[tried[0]] = self._reservation_for(job, tried[0], n, now)
        elif stamp[0] == BARRED:
            _, tier, types, n, runs = stamp
            if (
                unreserved
                or job.tier != tier
                or not self._still_barred(job, types, n, runs, now, ctx)
            ):
                return False
        elif unreserved or self._blocked_stamp(job, now) != stamp:
            return False
        else:
            n = start_sizes(job.spec, self.policy.elastic)[-1]  # the smallest a try asks for
        self._note_blocked(types, n, ctx)
        return True

    def _barred_stamp(
        self, job: Job, types: list[str], n: int, now: float, ctx: CycleContext
    ) -> tuple | None:
        """The stamp of a failed try that found every type it tried (`types`, in order) either
        barred by a count reservation it may not delay or short of `n` free GPUs, for a policy
        that neither preempts nor has quotas and a job with one start size of whole GPUs:
        nothing else can have made the try fail (see `_still_barred`). It holds the job's
        tier, the types, the size and the job's estimated run on each type (fixed while it
        waits). None for any other try."""
        policy = self.policy
        if policy.preemption or policy.quotas or ctx.kept_for is None or not types:
            return None
        spec = job.spec
        if spec.gpu_milli < MILLI or len(start_sizes(spec, policy.elastic)) > 1:
            return None
        free = self.index.type_free
        runs = []
        for t in types:
            res = self._reservation_over(job, t, ctx)
            if res is not None and not self._backfill_ok(res, job, t, n, now):
                if res.node is not None:
                    return None
            elif free[t] >= n:
                return None
            runs.append(self.est_runtime(job, t, n))
        return (BARRED, int(job.tier), tuple(types), n, tuple(runs))

    def _still_barred(
        self, job: Job, types: tuple, n: int, runs: tuple, now: float, ctx: CycleContext
    ) -> bool:
        """Whether a `_barred_stamp`ed job's try would fail the same way again, and if so what
        that try notes (`engine.waiting`, `last_try`). Its try is no `_hopeless` one while some
        accepted type has `n` GPUs free; it tries the same types while the policy offers them;
        and on each it either skips placement, where a count reservation of a job walked before
        it (`_reservation_over`), not its own, has fewer spare GPUs than `n` and a shadow time
        before the end of its run there (time passing only moves that end later), or finds
        fewer than `n` GPUs free."""
        free = self.index.type_free
        for t in job.types:
            if free[t] >= n:
                break
        else:
            return False
        if not self._fixed_types and tuple(self._candidate_types(job, ctx)) != types:
            return False
        reservations, jobs, policy = ctx.reservations, self.jobs, self.policy
        kept_for = None
        for t, run in zip(types, runs, strict=True):
            res = reservations.get(t)
            if (
                res is not None
                and res.job_id != job.id
                and now + run > res.shadow_time
                and n > res.extra
            ):
                holder = jobs.get(res.job_id)
                if holder is None or (
                    holder.tier <= job.tier and not policy.passes_reservation(ctx.view, job, holder)
                ):
                    if res.node is not None:
                        return False
                    kept_for = res.job_id
                    continue
            if free[t] >= n:
                return False
        self.last_try[job.id] = now
        self._waits[job.id] = (n, kept_for, False)
        return True

    def _starts_of(self, gpu_type: str, tiers: tuple[int, ...], band: int = 0) -> int:
        """Jobs of `tiers` started on the type so far (new victims for a job of a policy that
        may stop those tiers), of those expected to run at least 2**`band` seconds."""
        starts, n = self._starts, 0
        for k in tiers:  # (a loop, not a generator: every hopeless check of a long queue asks)
            n += starts[(gpu_type, k)][band]
        return n

    def _starts_at(self, gpu_type: str, now: float) -> int:
        """Jobs started on the type at `now` (no victims until time has passed)."""
        at, k = self._starts_now.get(gpu_type, NOT_STARTED)
        return k if at == now else 0

    def _stamp(self, gpu_type: str) -> int:
        """What a placement search on the type depends on that can make it succeed later (see
        `engine.memo`): GPUs and rack power freed on it or on a type sharing its racks' power
        caps."""
        return self._near_freed[gpu_type]

    def _preempt_stamp(self, gpu_type: str, now: float) -> tuple:
        """As `_stamp`, plus what can give a preemption search more victims: jobs started on
        the type before `now` (those started at `now` are no victims yet) and changed borrowed
        flags. A policy whose order changes with time (attained service) may also change whom
        it lets preempt whom, so its failures last one cycle."""
        started = self._starts_of(gpu_type, TIERS) - self._starts_at(gpu_type, now)
        clock = None if self.policy.incremental else now
        return (self._stamp(gpu_type), started, self._flips[gpu_type], clock)
