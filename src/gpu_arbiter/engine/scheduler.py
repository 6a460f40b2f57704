"""One scheduling cycle, shared by the simulator and the live control plane.

The `Scheduler` is the engine's facade: drivers report what happened (`submit`, `finished`,
`stopped`, `node_down`, ...) and call `cycle(now)`, which returns the decisions to carry out.
It never reads a clock, a file or a socket.

What it holds are objects, each the answer to one question: `engine.state.EngineState` (what
runs where, holds, stops under notice; its methods are the only mutators of all that),
`engine.capacity` (free GPUs), `engine.fit` (which types a job can run on, how fast),
`engine.ordering` (the pending queue), `engine.admission` and `engine.fairshare` (the books),
`engine.memo.PendingNotes` (what the walk noted about each pending job). The steps of a cycle
are classes mixed into the facade, one module per question: `engine.walk` (one pending job:
place -> preempt -> reserve), `engine.memo` (blocked and hopeless stamps),
`engine.reservations` (backfill reservations), `engine.preemption` (who may be a victim, in
what order, with what notice, which plan wins) and `engine.waiting` (why a pending job waits,
`why_pending`). They read the state and change it only through `EngineState`; the cycle's
context (`engine.context`) is passed to them explicitly. The steps are mixins, not objects,
because they call one another at every level of one job's try (the walk asks the memo, the
preemption plan asks eligibility, victims, notices and reservations, each asks `admissible`,
`est_runtime`, `types_by_speed`): as objects each would reach back through the facade for the
same names, on the path every pending job takes each cycle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpu_arbiter.domain import (
    Allocation,
    Cluster,
    Decision,
    InvalidInput,
    Job,
    JobState,
    Preempt,
    Team,
    Tier,
)
from gpu_arbiter.domain.team import check_quotas
from gpu_arbiter.engine.admission import BudgetRule, QuotaBook, admitted_tier
from gpu_arbiter.engine.backfill import Reservation
from gpu_arbiter.engine.capacity import CapacityIndex
from gpu_arbiter.engine.config import EngineConfig
from gpu_arbiter.engine.context import CycleContext, CycleView
from gpu_arbiter.engine.elastic import grown_allocation
from gpu_arbiter.engine.fairshare import FairShare
from gpu_arbiter.engine.fit import TypeFit
from gpu_arbiter.engine.memo import HOPELESS, FailureMemo, PendingNotes, Stamps
from gpu_arbiter.engine.ordering import PendingQueue
from gpu_arbiter.engine.policy import Backfill, Heterogeneity, Policy, get_policy
from gpu_arbiter.engine.preemption.eligibility import Eligibility
from gpu_arbiter.engine.preemption.grace import Notices
from gpu_arbiter.engine.preemption.plan import PreemptionStep
from gpu_arbiter.engine.preemption.victims import VictimCache, VictimLists
from gpu_arbiter.engine.reservations import Reservations
from gpu_arbiter.engine.sharing import SharedGpus
from gpu_arbiter.engine.spares import HotSpares
from gpu_arbiter.engine.state import EngineState
from gpu_arbiter.engine.waiting import Tried, WhyPending
from gpu_arbiter.engine.walk import Walk


@dataclass(slots=True)
class CycleResult:
    decisions: list[Decision]
    next_wakeup: float | None
    examined: int
    started: int
    preempted: int
    free_gpus: int
    fragmentation: float  # share of free GPUs that are not on a wholly free node (S6)
    stranded_gpus: int  # free GPUs of types on which a pending job that would fit is blocked


class Scheduler(
    Walk,
    Stamps,
    Reservations,
    PreemptionStep,
    VictimLists,
    Notices,
    Eligibility,
    WhyPending,
):
    """The engine's facade: what drivers report, and `cycle`. The steps live in the mixed-in
    classes, the running state in `state` (see the module doc)."""

    def __init__(
        self,
        cluster: Cluster,
        teams: Iterable[Team] = (),
        policy: Policy | str = "arbiter",
        config: EngineConfig | None = None,
        budget: BudgetRule | None = None,
    ) -> None:
        self.cluster = cluster
        self.policy = get_policy(policy) if isinstance(policy, str) else policy
        self.cfg = config or EngineConfig()
        self.budget = budget
        capacity = cluster.gpus_by_type()
        team_list = list(teams)
        check_quotas(team_list, capacity)
        self.teams = {t.name: t for t in team_list}
        self.index = CapacityIndex(cluster)
        # Which types a job runs on, and how fast (`engine.fit`): the scheduler's own answers.
        self.fit = TypeFit(cluster, self.index)
        self.speed, self.types_by_speed = self.fit.speed, self.fit.types_by_speed
        self.faster_types = self.fit.faster_types
        self.spares = HotSpares(self.index)
        self.shared = SharedGpus(self.index)
        self.quota = QuotaBook(self.teams, capacity)
        self.fair = FairShare(
            capacity, {t.name: t.weight for t in team_list}, self.cfg.fairshare_half_life_s
        )
        self.queue = PendingQueue(self.policy.group_key, self.policy.rank_key)
        self.jobs: dict[str, Job] = {}
        self.notes = PendingNotes()  # what the walk noted about each pending job
        self._victims = VictimCache()  # the victim lists of the cycle in progress
        self.state = st = EngineState(
            cluster,
            self.policy,
            self.cfg,
            budget,
            self.index,
            self.spares,
            self.shared,
            self.quota,
            self.fair,
            self.queue,
            self.fit,
            self.notes,
            self._victim_changed,
        )
        # The state's indexes under the names the steps, policies and drivers read them by;
        # only the state's methods change them.
        self.running, self.running_by_type = st.running, st.running_by_type
        self.running_by_tier, self.borrowed_by_type = st.running_by_tier, st.borrowed_by_type
        self.slower_than, self.ends_by_type = st.slower_than, st.ends_by_type
        self.team_jobs, self.elastic_running = st.team_jobs, st.elastic_running
        self.node_jobs, self.drained = st.node_jobs, st.drained
        self.holds, self.hold_of, self.pending_stops = st.holds, st.hold_of, st.pending_stops
        self._watts = st.watts
        # Its counters of change and the walk's notes, which the memos read (`engine.memo`).
        self._epoch, self._freed, self._flips = st.epoch, st.freed, st.flips
        self._near_epoch, self._near_freed = st.near_epoch, st.near_freed
        self._starts, self._starts_now = st.starts, st.starts_now
        self._blocked, self.last_try = self.notes.blocked, self.notes.last_try
        self._waits: dict[str, Tried] = self.notes.waits
        # Jobs that reported a checkpoint through a live driver's SDK: they keep checkpoints even
        # without a declared interval, so a failure does not demote them (E3).
        self.sdk_checkpoints: set[str] = set()
        # Incremental cycles (see `_fresh_order`): what the last full walk reserved and found
        # blocked (whether capacity was freed since, and the jobs queued since: `EngineState`).
        self._reservations: dict[str, Reservation] = {}
        self._blocked_types: set[str] = set()
        self._stranded_types: set[str] = set()
        self._seq = 0
        self._place_failed = FailureMemo()
        # EASY: read for every blocked job. Only such a policy reads walltime estimates (it
        # ranks victims by them too, `victim_options`).
        self._reserves = self.policy.backfill == Backfill.RESERVE
        # A policy that keeps `Policy.candidate_types` and takes no slower type by choice
        # offers every job its accepted types fastest first (`Walk._candidate_types`).
        self._fixed_types = (
            type(self.policy).candidate_types is Policy.candidate_types
            and self.policy.heterogeneity != Heterogeneity.SMART
        )
        self._preempt_failed = FailureMemo()
        self._view: CycleView | None = None  # the policy's view, made at the first cycle

    def submit(self, spec, now: float) -> Job:
        """Queue a job; a job that can never fit this cluster is refused with InvalidInput."""
        if spec.id in self.jobs:
            raise InvalidInput(f"job {spec.id!r} was already submitted")
        self.fit.check_fits(spec)
        self._seq += 1
        tier = admitted_tier(spec, self.cfg, self.budget)
        if tier == Tier.CORE and self.policy.quotas and not self.cfg.tier1_borrows_at_tier2:
            if not self._tier1_can_fit(spec):
                tier = Tier.BUSINESS  # it could never start at tier 1, nor borrow at tier 2
        job = Job(
            spec=spec,
            tier=tier,
            queued_since=now,
            updated_at=now,
            seq=self._seq,
        )
        job.types = self.fit.types_by_speed(job)  # read directly on every step of the walk
        self.jobs[spec.id] = job
        self.state.enqueue(job)
        return job

    def resubmit(self, spec, submitted_at: float, tier: Tier) -> Job:
        """Queue a job a live driver knows from its database at the tier it last ran at (a
        failure or a budget may have lowered it since it was submitted)."""
        job = self.submit(spec, submitted_at)
        if job.tier != tier:
            self.queue.remove(job)
            job.tier = Tier(tier)
            self.queue.add(job)
        return job

    def finished(self, job_id: str, now: float) -> Job:
        job = self.state.running_job(job_id)
        job.advance(now)
        job.close_segment(job.spec.duration_s)
        self.state.release(job)
        self.state.forget_stop(job_id)  # it may finish within a stop notice's grace
        self.fit.forget(job_id)
        job.state = JobState.COMPLETED
        job.finished_at = now
        self.state.victim_gone(job_id, now)
        return job

    def stopped(self, job_id: str, now: float) -> Job:
        """A job preempted with grace has stopped (saving a checkpoint if one was requested)."""
        job = self.state.running_job(job_id)
        order = self.state.forget_stop(job_id)
        self.state.stop(job, now, keep_all=bool(order and order.checkpoint))
        self.state.victim_gone(job_id, now)
        return job

    def cancel(self, job_id: str, now: float) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise InvalidInput(f"unknown job {job_id!r}")
        if job.state not in (JobState.PENDING, JobState.RUNNING):
            raise InvalidInput(f"job {job_id!r} is already {job.state.value}")
        if job_id in self.holds:
            self.state.cancel_hold(self.holds[job_id])
        if job.state == JobState.RUNNING:
            job.advance(now)
            job.close_segment(job.progress_s)
            self.state.release(job)
            self.state.forget_stop(job_id)
            self.state.victim_gone(job_id, now)
        self.queue.remove(job)
        self.notes.forget(job.id)
        self.fit.forget(job.id)
        job.state = JobState.CANCELLED
        job.finished_at = now
        return job

    def node_down(self, name: str, now: float) -> list[str]:
        """Cordon a node; its jobs lose the work since their last checkpoint and are requeued
        (a job without checkpointing is demoted one tier, E3). Returns the affected job ids."""
        node = self.cluster.node(name).index
        if self.index.down[node] and node not in self.drained:
            return []
        self.state.take_out(node, drain=False)
        affected = sorted(self.node_jobs[node], key=lambda j: self.jobs[j].seq)
        for job_id in affected:
            self._fail(self.jobs[job_id], now)
        self._restart_on_spares([self.jobs[j] for j in affected], now)
        return affected

    def checkpoints(self, job: Job) -> bool:
        """Whether the job keeps checkpoints, so a failure costs it only the work since the
        last one and does not demote it (E3): when it asked for periodic ones, or reported one
        (`sdk_checkpoints`)."""
        return job.spec.checkpoint_interval_s is not None or job.id in self.sdk_checkpoints

    def lost(self, job_id: str, now: float) -> Job:
        """A running job's node failed under it, and the executor said so for the job (Slurm's
        NODE_FAIL) before or without the node being seen down: the same as `node_down` does
        for each job of a failed node — a restart, requeued with what its checkpoint kept,
        demoted only without checkpoints (E3), on a hot spare first when one is held (F2)."""
        job = self.state.running_job(job_id)
        self._fail(job, now)
        self._restart_on_spares([job], now)
        return job

    def _fail(self, job: Job, now: float) -> None:
        """A running job lost its node: requeue it with only what its checkpoint kept (a job
        without checkpoints is demoted one tier, E3) and count the restart. The caller puts
        it on a hot spare (`_restart_on_spares`) once every failed job is requeued."""
        self.state.forget_stop(job.id)
        demote = (
            self.cfg.demote_after_uncheckpointed_failure
            and not self.checkpoints(job)
            and job.tier < Tier.EXPLORATORY
        )
        job.restarts += 1
        self.state.stop(job, now, keep_all=False, demote=demote)
        self.state.victim_gone(job.id, now)

    def reserve_spares(self, names: Iterable[str]) -> None:
        """Hold these (wholly free) nodes back as hot spares (F2, see `engine.spares`)."""
        for name in names:
            self.state.reserve_spare(self.cluster.node(name).index)

    def node_up(self, name: str, now: float) -> None:
        """A node that was down or drained is in service again."""
        node = self.cluster.node(name).index
        if self.index.down[node]:
            self.state.put_back(node)

    def drain(self, name: str) -> None:
        """Take a node out of placement without stopping its jobs (a degraded node: what runs
        there goes on, nothing new starts there, and no plan counts on its GPUs coming free).
        `node_up` puts it back in service; `node_down` still stops its jobs."""
        node = self.cluster.node(name).index
        if not self.index.down[node]:
            self.state.take_out(node, drain=True)

    def restart(self, job_id: str, now: float) -> Job:
        """Stop a running job, losing the work since its last checkpoint, and queue it again
        (a gang restarted without the straggling node it ran on)."""
        job = self.state.running_job(job_id)
        self.state.forget_stop(job_id)
        job.restarts += 1
        self.state.stop(job, now, keep_all=False)
        self.state.victim_gone(job_id, now)
        return job

    def demote(self, job_id: str, tier: Tier, now: float) -> bool:
        """A running job keeps its GPUs at `tier` from now on, a lower priority than it runs
        at (its team's budget ran out mid-run, E1): a victim as any job of that tier, first to
        lose borrowed capacity. Returns whether its tier changed; a tier is never raised."""
        job = self.state.running_job(job_id)
        if tier <= job.tier:
            return False
        self.state.retier(job, tier, now)
        return True

    def adopt(self, job: Job, allocation: Allocation, started_at: float) -> None:
        """Mark a queued job running on exactly `allocation` without a Start decision (a live
        driver that restarts finds it running); refuses GPUs unknown, down or taken."""
        self.state.adopt(job, allocation, started_at)

    def move_gpus(self, job_id: str, allocation: Allocation) -> bool:
        """Record that a running job holds other GPU indices on the same nodes than the engine
        chose (an executor such as Slurm picks them); False, changing nothing, where the books
        would double-book a GPU."""
        return self.state.move_gpus(job_id, allocation)

    def cycle(self, now: float) -> CycleResult:
        """Decide; the result also carries decisions made since the last cycle by reported
        events (a held job starting when its last victim stopped). The steps, in order, each
        over the cycle's context (`engine.context`):

        1. begin: a full walk, or the newcomers only against the last walk's reservations;
        2. fair-share usage decays to now, and a round-based policy re-plans (it may preempt);
        3. walk the pending jobs, each through place -> preempt -> reserve (`engine.walk`);
        4. a full walk lets the policy move running jobs onto GPUs left free (`engine.migration`);
        5. keep what the walk reserved and found blocked for the next newcomers-only cycle;
        6. elastic jobs grow into what is left;
        7. end: the decisions, the next wake-up and the cycle's gauges."""
        ctx, full = self._begin_cycle(now)
        self.fair.decay_to(now)
        self.policy.before_cycle(ctx.view, now)
        examined, started = self._walk_pending(ctx, full)
        if full:
            self.policy.after_walk(ctx.view, now, ctx.reservations)
        self._keep_for_next_cycle(ctx)
        if self.policy.elastic:
            self._grow(now, ctx.blocked_types)
        return self._end_cycle(ctx, examined, started)

    def type_epoch(self, gpu_type: str) -> int:
        """A counter that every start, stop, resize, hold, fault, repair and borrowed-flag
        change on the type moves (`engine.memo`): a policy's notes about the type's running
        jobs stand while it holds."""
        return self.state.epoch[gpu_type] + self.state.flips[gpu_type]

    def reranked(self, gpu_type: str) -> None:
        """A running job on the type became a victim it was not by the policy's order, which
        changes with time (its attained service rose, `engine.discipline`): preemption
        searches and waits that failed before may succeed now."""
        self.state.reranked(gpu_type)

    def _begin_cycle(self, now: float) -> tuple[CycleContext, bool]:
        """The cycle's context, and whether it walks every pending job (anything freed since
        the last cycle, a policy that is not incremental, or jobs started at an earlier time
        that are victims now that were none then) or only the newcomers, against the
        reservations and blocked types of the last full walk."""
        state = self.state
        ctx = CycleContext(now=now)
        if self._view is None:
            self._view = CycleView(self, ctx)
        ctx.view = self._view.begin(ctx)
        self._victims.begin(now)
        self.policy.note_time(ctx.view, now)  # may mark running jobs new victims (`reranked`)
        new_victims = state.started_at is not None and now > state.started_at
        full = state.dirty or not self.policy.incremental or new_victims
        if new_victims:
            state.started_at = None
        if not full:
            ctx.reservations = {t: r.copy() for t, r in self._reservations.items()}
            ctx.blocked_types = set(self._blocked_types)
            ctx.stranded_types = set(self._stranded_types)
        return ctx, full

    def _walk_pending(self, ctx: CycleContext, full: bool) -> tuple[int, int]:
        """Try each pending job in the policy's order (or the newcomers, `_fresh_order`) until
        the walk is capped or stopped; returns (examined, started). A capped walk may have left
        startable jobs unexamined: then the next cycle looks at everything."""
        now = ctx.now
        examined = started = 0
        fresh = self.state.take_fresh()
        self.queue.begin_walk()
        try:
            walk = self.policy.ordered(ctx.view, now) if full else self._fresh_order(fresh)
            # The loop every pending job goes through, most of them only to be found still
            # blocked: the names it reads are looked up once.
            limit, holds, pending, try_start = (
                self.cfg.max_examined,
                self.holds,
                JobState.PENDING,
                self._try_start,
            )
            for job in walk:
                if examined >= limit or ctx.stop:
                    break
                if job.state != pending or job.id in holds:
                    continue
                examined += 1
                if try_start(job, now, ctx):
                    started += 1
        finally:
            self.queue.end_walk()
        self.state.dirty = (
            ctx.retry
            or examined >= self.cfg.max_examined
            or ctx.attempts >= self.cfg.max_preemption_attempts
        )
        return examined, started

    def _keep_for_next_cycle(self, ctx: CycleContext) -> None:
        """Keep the walk's reservations and blocked types for the next newcomers-only cycle,
        with what this one added: a blocked newcomer's reservation and the extra GPUs
        backfilled jobs took."""
        self._reservations = {t: r.copy() for t, r in ctx.reservations.items()}
        self._blocked_types = set(ctx.blocked_types)
        self._stranded_types = set(ctx.stranded_types)

    def _end_cycle(self, ctx: CycleContext, examined: int, started: int) -> CycleResult:
        """The decisions made since the last cycle, when to look again and the gauges. A victim
        stopped at once gets its look in a cycle right after this one (in the simulator no
        event may come for hours; the live loop would look at once too)."""
        now = ctx.now
        free = self.index.total_free
        whole = sum(self.index.whole_free.values())
        decisions = self.state.take_decisions()
        self._victims.clear()  # what happens until the next cycle need not keep them current
        return CycleResult(
            decisions=decisions,
            next_wakeup=now if ctx.stopped_at_once else self.policy.next_wakeup(ctx.view, now),
            examined=examined,
            started=started,
            preempted=ctx.preempted,
            free_gpus=free,
            fragmentation=(1 - whole / free) if free else 0.0,
            stranded_gpus=sum(self.index.type_free[t] for t in ctx.stranded_types),
        )

    def _fresh_order(self, fresh: list[Job]) -> list[Job]:
        """Jobs queued since the last cycle, by tier then age. Used when nothing was released
        since then: every job that was blocked is still blocked (capacity only shrank and the
        running set is the same), so only the newcomers need a look, against the reservations
        of the last full walk."""
        return sorted(
            (j for j in fresh if j.id in self.queue),
            key=lambda j: (j.tier, self.policy.rank_key(j), j.seq),
        )

    def preempt(self, job: Job, now: float, reason: str, for_job: str | None = None) -> None:
        """Suspend a running job (for round-based policies that re-plan every round): it saves
        and stops within the time a save takes, or, where saves take no time or the policy does
        not save, stops at once."""
        save_s = self._suspension_s()
        if save_s > 0:
            self.notice_stop(job, save_s, reason, for_job)
            return
        self.state.stop_now(job, Preempt(job.id, 0.0, reason, for_job=for_job), now)

    def move(self, job: Job, alloc: Allocation, now: float, reason: str) -> None:
        """Stop a running job at once and start it again on `alloc` (engine.migration): a
        `Preempt` with no grace, then a `Start`, the decisions every driver applies."""
        self.state.stop_now(job, Preempt(job.id, 0.0, reason), now)
        self.state.start(job, alloc, now)

    def notice_stop(
        self, job: Job, grace_s: float, reason: str, for_job: str | None = None
    ) -> None:
        """Ask a running job to checkpoint and stop within `grace_s` (a tier-2 move, S1; a
        round-based policy's suspension): it keeps all its progress and is queued again when
        the driver reports it stopped."""
        self.state.give_notice(
            job, Preempt(job.id, grace_s, reason, for_job=for_job, checkpoint=True)
        )

    @property
    def reservations(self) -> Mapping[str, Reservation]:
        """The backfill reservations of the last walk, by GPU type (read-only)."""
        return MappingProxyType(self._reservations)

    def set_aside(self, job_id: str) -> str | None:
        """Why the pending job gets no full try until something it looked at changes
        (`engine.memo`): "hopeless" (no accepted type has its GPUs free and nobody it may stop
        runs there), "blocked" (its last try failed under the state it still sees), or None
        (its next look is a full try)."""
        stamp = self._blocked.get(job_id)
        if stamp is None:
            return None
        return HOPELESS if stamp[0] == HOPELESS else "blocked"

    def find_for(
        self, job: Job, gpu_type: str, n: int, res: Reservation | None = None, strict: bool = False
    ) -> Allocation | None:
        """Where `n` GPUs of `gpu_type` for `job` would go now, or None (changes nothing): off
        the node `res` holds for another job where another node will do, and always if
        `strict`."""
        held = None if res is None or res.job_id == job.id else res.node
        return self._find(job, gpu_type, n, held, strict)

    def rule_out_move(self, job: Job, gpu_type: str) -> None:
        """The running job can gain nothing by moving to `gpu_type` for the rest of its run
        (`migration.never_worth`): drop it from `slower_than` there until it starts again or
        is resized."""
        self.state.rule_out_move(job, gpu_type)

    def _restart_on_spares(self, displaced: list[Job], now: float) -> None:
        """F2: restart jobs a failure displaced at once, tier 1 first, with the hot spares lent
        to placement; spares nobody used are held back again."""
        types = {t for j in displaced for t in self.types_by_speed(j) if self.spares.has(t)}
        if not types:
            return
        self.spares.lend()
        try:
            for job in sorted(displaced, key=lambda j: (j.tier, j.seq)):
                if job.state != JobState.PENDING:
                    continue
                n = job.spec.elastic_range[0]
                for t in self.types_by_speed(job):
                    if t not in types or not self.admissible(job, t, n):
                        continue
                    alloc = self._find(job, t, n)
                    if alloc is not None:
                        self.state.start(job, alloc, now)
                        break
        finally:
            self.spares.reclaim()

    def _grow(self, now: float, blocked_types: set[str]) -> None:
        if not self.index.total_free:
            return  # nothing to grow into (the elastic jobs need not be sorted)
        for job in sorted(self.elastic_running.values(), key=lambda j: (j.tier, j.seq)):
            t = job.allocation.gpu_type
            if t in blocked_types or job.id in self.pending_stops or not self.index.type_free[t]:
                continue
            bigger = grown_allocation(self.index, job, self._watts(job))
            if bigger is not None:
                self.state.resize(job, bigger, now, "grown into free capacity")

    def _tier1_can_fit(self, spec) -> bool:
        """A tier-1 job must fit in its team's quota plus the unowned pool of some accepted type
        (it can never be preempted, so it may not hold another team's guarantee); a larger
        tier-1 request runs at tier 2 when tier 1 may not borrow at tier 2. Only types the job
        can run on count."""
        need = spec.elastic_range[0] * spec.gpu_milli
        return any(
            self.quota.tier1_most(spec.team, t) >= need
            for t in self.index.max_size
            if self.fit.runs_on(spec, t)
        )
