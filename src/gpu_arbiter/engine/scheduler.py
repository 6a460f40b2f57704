"""One scheduling cycle, shared by the simulator and the live control plane.

The `Scheduler` holds the engine's view of the cluster (the capacity index, the pending queue,
the running jobs, quota and fair-share books) and changes it only through its methods: drivers
report what happened (`submit`, `finished`, `stopped`, `node_down`, ...) and call `cycle(now)`,
which returns the decisions to carry out. It never reads a clock, a file or a socket.

A cycle: bring running jobs up to date, let round-based policies re-plan, then walk pending jobs
in the policy's order and for each try, in turn: every accepted GPU type and start size within
the backfill reservations (placement), then a preemption plan (victims), then a reservation.
Finally elastic jobs grow into what is left.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain

from sortedcontainers import SortedList

from gpu_arbiter.domain import (
    MILLI,
    Allocation,
    Cluster,
    Decision,
    InvalidInput,
    Job,
    JobKind,
    JobState,
    Preempt,
    Resize,
    Start,
    Team,
    Tier,
)
from gpu_arbiter.domain.team import check_quotas
from gpu_arbiter.engine.admission import BudgetRule, QuotaBook, admitted_tier, budget_capped
from gpu_arbiter.engine.backfill import (
    Reservation,
    expected_free_at,
    fits_before,
    may_take,
    node_free_at,
    reserve,
)
from gpu_arbiter.engine.borrowing import Borrowing
from gpu_arbiter.engine.capacity import CapacityIndex
from gpu_arbiter.engine.config import EngineConfig
from gpu_arbiter.engine.elastic import grown_allocation, shrunk_allocation, start_sizes
from gpu_arbiter.engine.fairshare import FairShare
from gpu_arbiter.engine.memo import FailureMemo
from gpu_arbiter.engine.ordering import PendingQueue
from gpu_arbiter.engine.placement import Request, gpus_to_mask, place
from gpu_arbiter.engine.policy import Policy, get_policy
from gpu_arbiter.engine.preemption import (
    Option,
    PreemptionPlan,
    notice_given,
    notice_wait,
    option_key,
    plan_preemption,
    shared_gpu_option,
    shared_notice,
    shared_unsaved,
    victim_options,
)
from gpu_arbiter.engine.sharing import SharedGpus, shared_gpu
from gpu_arbiter.engine.spares import HotSpares

_TIERS = (1, 2, 3)
# Starts are counted by the run their walltime estimate gives them: band b counts those expected
# to run at least 2**b seconds (the last band, about 68 years and beyond, those without one).
_RUN_BANDS = 32
_HOPELESS = "hopeless"  # marks a `_blocked` stamp made by `Scheduler._hopeless`
_WHOLE_TYPE = -1  # no node: a count reservation bars the whole type (`Scheduler._reserved_node`)


def _run_band(run: float) -> int:
    """The band of `_RUN_BANDS` a run of `run` seconds falls in: the largest b with
    2**b <= `run` (0 below 2 seconds, the last band at most)."""
    if run >= 2.0 ** (_RUN_BANDS - 1):
        return _RUN_BANDS - 1
    return math.frexp(run)[1] - 1 if run >= 2.0 else 0


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


@dataclass(slots=True)
class Hold:
    """GPUs kept for a job while the tier-2 victims it preempted use up their grace."""

    job: Job
    allocation: Allocation
    waiting: set[str]
    held: list[tuple[int, int]] = field(default_factory=list)  # (node, mask) taken for it


@dataclass(slots=True)
class _Cycle:
    reservations: dict[str, Reservation] = field(default_factory=dict)
    now: float = 0.0
    victims: dict[tuple, list[Option]] = field(default_factory=dict)  # `_victim_groups`
    victim_index: dict[tuple, dict[str, Option]] = field(default_factory=dict)  # by job id
    dry_runs: dict[tuple, tuple[int, float | None]] = field(default_factory=dict)
    scopes: dict[tuple, tuple[bool, bool] | None] = field(default_factory=dict)  # one try's
    shadows: dict[tuple[str, int], tuple[int, float]] = field(default_factory=dict)
    attempts: int = 0
    preempted: int = 0
    high_power: dict[int, int] = field(default_factory=dict)
    blocked_types: set[str] = field(default_factory=set)
    stranded_types: set[str] = field(default_factory=set)
    waiting: dict[str, int] = field(default_factory=dict)  # GPUs blocked jobs want, by type
    stop: bool = False
    timely: bool = False  # the job being looked at met a rule that can change with time alone
    wait_on: str | None = None  # the type the job being looked at waits for, if not its fastest
    retry: bool = False  # a per-cycle limit (power stagger) held a job back: look again next cycle
    # A victim stopped at once went back to the queue behind the walk: it may fit elsewhere now.
    stopped_at_once: bool = False


class Scheduler:
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
        self.spares = HotSpares(self.index)
        self.shared = SharedGpus(self.index)
        self.quota = QuotaBook(self.teams, capacity)
        self.fair = FairShare(
            capacity, {t.name: t.weight for t in team_list}, self.cfg.fairshare_half_life_s
        )
        self.queue = PendingQueue(self.policy.group_key, self.policy.rank_key)
        self.jobs: dict[str, Job] = {}
        self.running: dict[str, Job] = {}
        self.running_by_type: dict[str, dict[str, Job]] = {t: {} for t in capacity}
        self.running_by_tier: dict[tuple[str, int], dict[str, Job]] = {
            (t, k): {} for t in capacity for k in (1, 2, 3)
        }
        self.borrowed_by_type: dict[str, dict[str, Job]] = {t: {} for t in capacity}
        # Running jobs by each type they would run faster on (`faster_types`), for moves, less
        # those the move step ruled out for their current run (`rule_out_move`).
        self.slower_than: dict[str, dict[str, Job]] = {t: {} for t in capacity}
        # Running jobs by expected end (walltime estimate), for backfill reservations.
        self.ends_by_type: dict[str, SortedList] = {t: SortedList() for t in capacity}
        # Running jobs by team and type, in the order they fill the team's quota (S2).
        self.team_jobs: dict[tuple[str, str], Borrowing] = {}
        self.elastic_running: dict[str, Job] = {}
        self.node_jobs: list[set[str]] = [set() for _ in cluster.nodes]
        self.holds: dict[str, Hold] = {}
        self.hold_of: dict[str, str] = {}  # victim id -> id of the job holding GPUs for it
        self.pending_stops: dict[str, Preempt] = {}
        self._decisions: list[Decision] = []
        self._ctx = _Cycle()  # the cycle in progress (or the last one)
        # Incremental cycles (see `_fresh_order`): whether capacity was freed since the last
        # cycle, the jobs queued since, and what the last full walk reserved and found blocked.
        self._dirty = True
        self._fresh: list[Job] = []
        self._reservations: dict[str, Reservation] = {}
        self._blocked_types: set[str] = set()
        self._stranded_types: set[str] = set()
        self._seq = 0
        self._max_gang: dict[tuple[str, int | None], int] = {}
        self._faster: dict[str, tuple[str, list[str]]] = {}  # see faster_types
        self._max_domain: dict[str, int] = {}
        self._power_coupled = self._types_sharing_racks(cluster)
        # Bumped whenever a type's running set changes, so per-cycle caches know they are stale.
        self._epoch: dict[str, int] = {t: 0 for t in capacity}
        self._freed: dict[str, int] = {t: 0 for t in capacity}  # bumped when GPUs free up
        self._starts: dict[tuple[str, int], list[int]] = {
            (t, k): [0] * _RUN_BANDS for t in capacity for k in _TIERS
        }
        self._starts_now: dict[str, tuple[float, int]] = {}  # starts at the latest start time
        self._flips: dict[str, int] = {t: 0 for t in capacity}  # borrowed flags changed
        self._blocked: dict[str, tuple] = {}  # job id -> `_blocked_stamp` of its last failure
        self._started_at: float | None = None  # when a job last started (a victim after that)
        self._place_failed = FailureMemo()
        # EASY: read for every blocked job. Only such a policy reads walltime estimates (it
        # ranks victims by them too, `victim_options`).
        self._reserves = self.policy.backfill == "reserve"
        self._preempt_failed = FailureMemo()
        for n in cluster.nodes:
            if n.gpus:
                self._max_domain[n.gpu_type] = max(
                    self._max_domain.get(n.gpu_type, 0), n.domain_size
                )

    @staticmethod
    def _types_sharing_racks(cluster: Cluster) -> dict[str, set[str]]:
        """For each GPU type, the types whose nodes share a rack (and so a power cap) with it."""
        by_rack: dict[str, set[str]] = {}
        for n in cluster.nodes:
            if n.gpus:
                by_rack.setdefault(n.rack, set()).add(n.gpu_type)
        coupled: dict[str, set[str]] = {}
        for types in by_rack.values():
            for t in types:
                coupled.setdefault(t, set()).update(types)
        return coupled

    # -- what drivers report ---------------------------------------------------------------

    def submit(self, spec, now: float) -> Job:
        """Queue a job; a job that can never fit this cluster is refused with InvalidInput."""
        if spec.id in self.jobs:
            raise InvalidInput(f"job {spec.id!r} was already submitted")
        self._check_fits(spec)
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
        self.jobs[spec.id] = job
        self.queue.add(job)
        self._fresh.append(job)
        return job

    def finished(self, job_id: str, now: float) -> Job:
        job = self._running(job_id)
        job.advance(now)
        job.close_segment(job.spec.duration_s)
        self._release(job)
        self.pending_stops.pop(job_id, None)  # it may finish within a stop notice's grace
        job.state = JobState.COMPLETED
        job.finished_at = now
        self._victim_gone(job_id, now)
        return job

    def stopped(self, job_id: str, now: float) -> Job:
        """A job preempted with grace has stopped (saving a checkpoint if one was requested)."""
        job = self._running(job_id)
        order = self.pending_stops.pop(job_id, None)
        self._stop(job, now, keep_all=bool(order and order.checkpoint))
        self._victim_gone(job_id, now)
        return job

    def cancel(self, job_id: str, now: float) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise InvalidInput(f"unknown job {job_id!r}")
        if job.state not in (JobState.PENDING, JobState.RUNNING):
            raise InvalidInput(f"job {job_id!r} is already {job.state.value}")
        if job_id in self.holds:
            self._cancel_hold(self.holds[job_id])
        if job.state == JobState.RUNNING:
            job.advance(now)
            job.close_segment(job.progress_s)
            self._release(job)
            self.pending_stops.pop(job_id, None)
            self._victim_gone(job_id, now)
        self.queue.remove(job)
        self._blocked.pop(job.id, None)
        job.state = JobState.CANCELLED
        job.finished_at = now
        return job

    def node_down(self, name: str, now: float) -> list[str]:
        """Cordon a node; its jobs lose the work since their last checkpoint and are requeued
        (a job without checkpointing is demoted one tier, E3). Returns the affected job ids."""
        node = self.cluster.node(name).index
        if self.index.down[node]:
            return []
        self.spares.lost(node)
        self.index.set_down(node)
        self._changed(self.index.node_type[node], freed=False)
        for hold in [h for h in self.holds.values() if node in h.allocation.nodes]:
            self._cancel_hold(hold)
        affected = sorted(self.node_jobs[node], key=lambda j: self.jobs[j].seq)
        for job_id in affected:
            job = self.jobs[job_id]
            self.pending_stops.pop(job_id, None)
            demote = (
                self.cfg.demote_after_uncheckpointed_failure
                and not self.checkpoints(job)
                and job.tier < Tier.EXPLORATORY
            )
            job.restarts += 1
            self._stop(job, now, keep_all=False, demote=demote)
            self._victim_gone(job_id, now)
        self._restart_on_spares([self.jobs[j] for j in affected], now)
        return affected

    def checkpoints(self, job: Job) -> bool:
        """Whether the job keeps checkpoints, so a failure costs it only the work since the
        last one and does not demote it (E3): here, when it asked for periodic ones."""
        return job.spec.checkpoint_interval_s is not None

    def reserve_spares(self, names: Iterable[str]) -> None:
        """Hold these (wholly free) nodes back as hot spares (F2, see `engine.spares`)."""
        for name in names:
            node = self.cluster.node(name).index
            self.spares.reserve(node)
            self._changed(self.index.node_type[node], freed=False)

    def node_up(self, name: str, now: float) -> None:
        node = self.cluster.node(name).index
        if not self.index.down[node]:
            return
        self._dirty = True
        busy = 0
        for job_id in self.node_jobs[node]:
            for n, gpus in self.jobs[job_id].allocation.slots:
                if n == node:
                    busy |= gpus_to_mask(gpus)
        for hold in self.holds.values():
            for n, mask in hold.held:
                if n == node:
                    busy |= mask
        self.index.set_up(node, busy)
        self._changed(self.index.node_type[node], freed=True)
        if not busy:
            self.spares.refill(node)

    def demote(self, job_id: str, tier: Tier, now: float) -> bool:
        """A running job keeps its GPUs at `tier` from now on, a lower priority than it runs
        at (its team's budget ran out mid-run, E1): a victim as any job of that tier, first to
        lose borrowed capacity. Returns whether its tier changed; a tier is never raised."""
        job = self._running(job_id)
        if tier <= job.tier:
            return False
        t = job.allocation.gpu_type
        self.quota.add(job.team, t, job.tier, -job.milli_held)
        del self.running_by_tier[(t, int(job.tier))][job.id]
        changed = self.team_jobs[(job.team, t)].remove(job)
        job.tier, job.borrows_at_tier2 = Tier(tier), False
        self.quota.add(job.team, t, job.tier, job.milli_held)
        self.running_by_tier[(t, int(job.tier))][job.id] = job
        changed += self._borrowing(job.team, t).add(job)
        self._rebalance(job.team, t, changed)
        # A new victim: preemption searches that failed before may succeed now.
        self._flips[t] += 1
        self._changed(t, freed=False)
        self._dirty = True
        if self.policy.preemption:
            self._started_at = now
        return True

    # -- the cycle -------------------------------------------------------------------------

    def cycle(self, now: float) -> CycleResult:
        """Decide; the result also carries decisions made since the last cycle by reported
        events (a held job starting when its last victim stopped)."""
        # Jobs started at an earlier time are victims now that were none then.
        new_victims = self._started_at is not None and now > self._started_at
        full = self._dirty or not self.policy.incremental or new_victims
        if new_victims:
            self._started_at = None
        ctx = self._ctx = _Cycle(now=now)
        if not full:
            ctx.reservations = {t: r.copy() for t, r in self._reservations.items()}
            ctx.blocked_types = set(self._blocked_types)
            ctx.stranded_types = set(self._stranded_types)
        self.fair.decay_to(now)
        self.policy.before_cycle(self, now)
        examined = started = 0
        fresh, self._fresh = self._fresh, []
        self.queue.begin_walk()
        try:
            walk = self.policy.ordered(self, now) if full else self._fresh_order(fresh)
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
        # A capped walk may have left startable jobs unexamined: look at everything next time.
        self._dirty = (
            ctx.retry
            or examined >= self.cfg.max_examined
            or ctx.attempts >= self.cfg.max_preemption_attempts
        )
        if full:
            # Moves onto GPUs the walk left free (engine.migration), within its reservations.
            self.policy.after_walk(self, now, ctx.reservations)
        # Kept for the next newcomers-only cycle, with what this one added: a blocked newcomer's
        # reservation and the extra GPUs backfilled jobs took.
        self._reservations = {t: r.copy() for t, r in ctx.reservations.items()}
        self._blocked_types = set(ctx.blocked_types)
        self._stranded_types = set(ctx.stranded_types)
        if self.policy.elastic:
            self._grow(now, ctx.blocked_types)
        free = self.index.total_free
        whole = sum(self.index.whole_free.values())
        decisions, self._decisions = self._decisions, []
        ctx.victims.clear()  # what happens until the next cycle need not keep them current
        ctx.victim_index.clear()
        return CycleResult(
            decisions=decisions,
            # A victim stopped at once gets its look in a cycle right after this one (in the
            # simulator no event may come for hours; the live loop would look at once too).
            next_wakeup=now if ctx.stopped_at_once else self.policy.next_wakeup(self, now),
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
        self._decisions.append(Preempt(job.id, 0.0, reason, for_job=for_job))
        job.preemptions += 1
        self._stop(job, now, keep_all=self.policy.suspend_saves)

    def move(self, job: Job, alloc: Allocation, now: float, reason: str) -> None:
        """Stop a running job at once and start it again on `alloc` (engine.migration): a
        `Preempt` with no grace, then a `Start`, the decisions every driver applies."""
        self._decisions.append(Preempt(job.id, 0.0, reason))
        job.preemptions += 1
        self._stop(job, now, keep_all=self.policy.suspend_saves)
        self._start(job, alloc, now)

    def notice_stop(
        self, job: Job, grace_s: float, reason: str, for_job: str | None = None
    ) -> None:
        """Ask a running job to checkpoint and stop within `grace_s` (a tier-2 move, S1; a
        round-based policy's suspension): it keeps all its progress and is queued again when
        the driver reports it stopped."""
        order = Preempt(job.id, grace_s, reason, for_job=for_job, checkpoint=True)
        self._decisions.append(order)
        job.preemptions += 1
        job.preempting = True
        self.pending_stops[job.id] = order

    def find_for(
        self, job: Job, gpu_type: str, n: int, res: Reservation | None = None, strict: bool = False
    ) -> Allocation | None:
        """Where `n` GPUs of `gpu_type` for `job` would go now, or None (changes nothing): off
        the node `res` holds for another job where another node will do, and always if
        `strict`."""
        held = None if res is None or res.job_id == job.id else res.node
        return self._find(job, gpu_type, n, held, strict)

    def types_by_speed(self, job: Job) -> list[str]:
        """Accepted GPU types of this cluster the job can run on, fastest for the job first."""
        types = job.types
        if types is None:
            types = job.types = sorted(
                (t for t in self.index.max_size if self._runs_on(job.spec, t)),
                key=lambda t: (-self.speed(job, t), t),
            )
        return types

    def faster_types(self, job: Job) -> list[str]:
        """The accepted types on which the running job would run faster than where it runs,
        fastest first (engine.migration looks at every running job each cycle; this is fixed
        while the job runs, so it is worked out once per start)."""
        here = job.allocation.gpu_type
        hit = self._faster.get(job.id)
        if hit is None or hit[0] != here:
            faster = [t for t in self.types_by_speed(job) if self.speed(job, t) > job.speed]
            hit = self._faster[job.id] = (here, [t for t in faster if t != here])
        return hit[1]

    def rule_out_move(self, job: Job, gpu_type: str) -> None:
        """The running job can gain nothing by moving to `gpu_type` for the rest of its run
        (`migration.never_worth`): drop it from `slower_than` there until it starts again or
        is resized."""
        del self.slower_than[gpu_type][job.id]

    def speed(self, job: Job, gpu_type: str) -> float | None:
        return job.spec.speed_on(gpu_type, self.cluster.gpu_types[gpu_type].speed)

    def _runs_on(self, spec, gpu_type: str) -> bool:
        """Whether a job accepts `gpu_type` and could ever be placed on it: its tp groups fit
        the type's NVLink domains and its smallest size the type's largest gang."""
        if spec.speed_on(gpu_type, 1.0) is None or self._max_domain[gpu_type] < spec.tp_size:
            return False
        key = (gpu_type, spec.max_racks)
        if key not in self._max_gang:
            self._max_gang[key] = self.cluster.max_gang(gpu_type, spec.max_racks)
        return self._max_gang[key] >= spec.elastic_range[0]

    # -- steps -----------------------------------------------------------------------------

    def _candidate_types(self, job: Job) -> list[str]:
        types = self.policy.candidate_types(self, job)
        if self.policy.heterogeneity != "smart" or len(types) < 2:
            return types
        fastest, n = types[0], job.spec.elastic_range[0]
        free, pinned = self.index.type_free, self.queue.pinned

        def spare(t: str) -> int:  # free GPUs of the type left after the job and pinned jobs
            return free[t] - n - pinned.get(t, 0)

        if spare(fastest) >= 0:
            return types
        # S7: the fastest type is wanted by jobs that cannot run elsewhere; a flexible job
        # starts now on a slower type that is still fast enough rather than take it from them,
        # but not on one that pinned jobs want too, and among equally fast ones on the roomiest:
        # Alibaba's flexible tier-1 pods took the 4 V100M16 GPUs, next by name, for days while
        # pods pinned to them waited (gpuspec33 seed 0: a 20-min tier-1 pod 103 h, now 1.8 h).
        floor = self.cfg.slower_type_min_speed * self.speed(job, fastest)
        speed = {t: self.speed(job, t) for t in types[1:]}
        slower = sorted(
            (t for t in types[1:] if speed[t] >= floor and spare(t) >= 0),
            key=lambda t: (-speed[t], -spare(t)),
        )
        return slower + [t for t in types if t not in slower]

    def _try_start(self, job: Job, now: float, ctx: _Cycle) -> bool:
        blocked = self._blocked.get(job.id)
        if blocked is not None and self._still_blocked(job, blocked, now, ctx):
            return False
        ctx.timely = False
        ctx.wait_on = None
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
        (`Policy.may_preempt`) and tier 1's queueing target (`engine.typechoice`). It is never
        worse off than a tier-2 job of its team: on msr `ee9e8c` (trace seed 2) a 2-min,
        16-GPU tier-1 job, which guarantee and pool could hold once other teams' tier-1 jobs
        left the pool, waited 8 h among tier-3 jobs (tier-1 P99 125 min; now 1 min)."""
        if job.tier != Tier.CORE or not self.cfg.tier1_borrows_at_tier2:
            return False
        return not all(self.admissible(job, t, n) for t in self.types_by_speed(job))

    def _attempt(self, job: Job, now: float, ctx: _Cycle) -> tuple | None:
        """One try at the job's current tier: None if it started (or preempted for a start),
        else (the types tried, the smallest size, the `_hopeless` stamp or None) for
        `_failed`."""
        ctx.scopes.clear()
        spec = job.spec
        sizes = start_sizes(spec, self.policy.elastic)
        hopeless = self._hopeless(job, sizes[-1])
        if hopeless is not None:
            types = self._types_when_hopeless(job, sizes[-1])
            if types is not None:
                return types, sizes[-1], hopeless
        types = self._candidate_types(job)
        if len(types) < len(self.types_by_speed(job)):
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
                if off_limits and res.node is None:
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
                self._start(job, alloc, now)
                return None
        if self.policy.preemption and self._try_preempt(job, types, sizes[-1], now, ctx):
            return None
        return types, sizes[-1], None

    def _hopeless(self, job: Job, n: int) -> tuple | None:
        """Whether the job can neither be placed (no accepted type has `n` whole free GPUs) nor
        preempt for (nothing of a tier it may take from runs on them): then a try fails on
        every type, whatever the policy offers, the reservations and the failure memos say.
        The common case for a tier-3 job over its quota in a busy queue, so it costs a look at
        the free counts and quota books only. Returns None, or what can end the wait (for
        `_still_hopeless`), per accepted type: the team's releases there (which can put it
        back within its quota, so it may reclaim), for a tier-1 job any GPUs freed there (the
        pool may have room again) and, where the job may take GPUs from some tier but nobody
        of it runs (or nobody the policy lets it stop), jobs of that tier started there that
        are expected to run long enough to be its victims (`Policy.victim_min_run`).
        Placement is only ever refused here for too few free GPUs, so power and topology need
        no stamp."""
        if job.spec.gpu_milli < MILLI:
            return None  # may fit on a GPU already shared
        free = self.index.type_free
        wake = []
        for t in self.types_by_speed(job):
            if free[t] >= n:
                return None
            starts = None
            scope = self._preempt_scope(job, t, n)
            if scope is not None:
                within, has_victims = scope
                if has_victims:
                    return None
                tiers = self.policy.victim_tiers(job, within)
                if tiers:
                    band = _run_band(self.policy.victim_min_run(self, job, t, within))
                    starts = (tiers, band, self._starts_of(t, tiers, band))
            wake.append((self._releases(job, t), starts))
        return (_HOPELESS, int(job.tier), n, tuple(wake))

    def _types_when_hopeless(self, job: Job, n: int) -> list[str] | None:
        """What `_candidate_types` gives a `_hopeless` job (`Policy.types_when_hopeless`), or
        None where only it can say. No accepted type has `n` GPUs free, so the smart order
        keeps the policy's too, as long as both ask about the same, smallest size."""
        if n != job.spec.elastic_range[0]:
            return None
        return self.policy.types_when_hopeless(self, job)

    def _releases(self, job: Job, gpu_type: str) -> int:
        """The release counter a `_hopeless` job watches on the type: its team's (the way back
        within quota) or, for tier 1, every release there (the way into the pool)."""
        if job.tier == Tier.CORE:
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
        core, team, releases = job.tier == Tier.CORE, job.team, self.quota.releases
        for t, (seen, starts) in zip(types, wake, strict=True):
            if free[t] >= n:
                return False
            if (self._freed[t] if core else releases.get((team, t), 0)) != seen:
                return False
            if starts is not None and self._starts_of(t, starts[0], starts[1]) != starts[2]:
                return False
        return True

    def _failed(
        self,
        job: Job,
        types: list[str],
        n: int,
        now: float,
        ctx: _Cycle,
        hopeless: tuple | None = None,
    ) -> None:
        """A try found no start: note the types it is blocked on, reserve the GPUs of the type
        it waits for (its fastest, unless the preemption step chose another) if none are
        reserved there (or stop the walk, for strict order) and remember the failure unless
        time alone can change it (by what it was blocked on, or by what can end its `hopeless`
        wait)."""
        self._note_blocked(types, n, ctx)
        if self.policy.backfill == "none":
            ctx.stop = True
        elif self._reserves and types:
            t = ctx.wait_on or types[0]
            if t not in ctx.reservations:
                ctx.reservations[t] = self._reservation_for(job, t, n, now)
        if self.policy.incremental and not ctx.timely:
            self._blocked[job.id] = hopeless or self._blocked_stamp(job, now)

    def _blocked_stamp(self, job: Job, now: float) -> tuple:
        """Everything a failed `_try_start` of the job looked at that can change without time
        passing: its tier and, per accepted type (and the types sharing its racks' power), every
        start, stop, resize, hold, fault and repair; jobs started at `now` count once `now` has
        passed (they are no victims in their first cycle)."""
        stamp: list = [int(job.tier)]
        for t in self.types_by_speed(job):
            stamp.append((self._coupled(self._epoch, t), self._starts_at(t, now)))
        return tuple(stamp)

    def _still_blocked(self, job: Job, stamp: tuple, now: float, ctx: _Cycle) -> bool:
        """Whether the job failed to start (or preempt) under the same state before: then it
        fails again, as every rule it went through depends only on that state or, for backfill,
        only gets stricter with time. Decisions that can change with time alone (lost work
        weighed against a wait, a policy holding types back, a staggered start) are never
        remembered. It still counts as blocked on its types, and a type without a reservation
        yet gets its reservation from a full look or, for a hopeless job, on the one type its
        full look would reserve (`_failed`), from here: its try would fail the same way."""
        types = self.types_by_speed(job)
        reservations = ctx.reservations
        unreserved = self._reserves and not all(map(reservations.__contains__, types))
        if stamp[0] == _HOPELESS:
            n = stamp[2]
            if not self._still_hopeless(job, stamp, types):
                return False
            if unreserved:
                # A hopeless job's failed try reserves its first candidate type only: the
                # others may stay unreserved for good, and looking again would not change that.
                tried = self._types_when_hopeless(job, n)
                if tried is None:
                    return False
                if tried[0] not in reservations:
                    reservations[tried[0]] = self._reservation_for(job, tried[0], n, now)
        elif unreserved or self._blocked_stamp(job, now) != stamp:
            return False
        else:
            n = start_sizes(job.spec, self.policy.elastic)[-1]  # the smallest a try asks for
        self._note_blocked(types, n, ctx)
        return True

    def _note_blocked(self, types: list[str], n: int, ctx: _Cycle) -> None:
        """A job wanting `n` GPUs is blocked on these types: they count as stranded where
        enough GPUs are free, and its GPUs as wanted ahead of anybody walked after it."""
        free, waiting = self.index.type_free, ctx.waiting
        ctx.blocked_types.update(types)
        for t in types:
            waiting[t] = waiting.get(t, 0) + n
            if free[t] >= n:
                ctx.stranded_types.add(t)

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
        needs one node: on Alibaba's lists 8-GPU tier-2 pods waited 18-55 h on average, while
        1-GPU tier-1 pods kept every node partly used, and long tier-3 pods barred from the
        held GPUs went to T4s that run them 2.3x slower."""
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

    def _reservation_over(self, job: Job, gpu_type: str, ctx: _Cycle) -> Reservation | None:
        """The backfill reservation the job must not delay on the type. A walk goes tier by
        tier, so a reservation is only ever made ahead of lower tiers; but a cycle that looks
        at newcomers only reuses the last walk's reservations, and a tier-1 newcomer must not
        wait behind the reservation of a tier-2 job it would have been walked before."""
        res = ctx.reservations.get(gpu_type)
        if res is None:
            return None
        holder = self.jobs.get(res.job_id)
        if holder is not None and holder.tier > job.tier:
            return None
        return res

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
        return may_take(res, job.id, n, self._est_runtime(job, gpu_type, n), now)

    def _est_runtime(self, job: Job, gpu_type: str, n: int) -> float:
        if job.spec.walltime_s is None:
            return math.inf
        rate = self.speed(job, gpu_type) * n / job.spec.gpus
        done = job.progress_s / job.spec.duration_s
        return job.spec.walltime_s * (1 - done) / rate

    def _book_spare(self, res: Reservation | None, job: Job, alloc: Allocation, now: float) -> None:
        """The job starts (or is held) on `alloc`: where that takes GPUs the reservation counts
        on, book the spare GPUs it uses past the shadow time (`fits_before`)."""
        if res is not None and res.covers(alloc):
            fits_before(res, alloc.gpus, self._est_runtime(job, alloc.gpu_type, alloc.gpus), now)

    def _request(self, job: Job, gpu_type: str, n: int) -> Request:
        s = job.spec
        return Request(gpu_type, n, s.tp_size, s.max_racks, s.power_profile, s.data_locality)

    def _power_stagger_ok(self, job: Job, alloc: Allocation, ctx: _Cycle) -> bool:
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

    def _try_preempt(self, job: Job, types: list[str], n: int, now: float, ctx: _Cycle) -> bool:
        deferred: tuple[PreemptionPlan, bool, str] | None = None
        for t in types:
            if ctx.attempts >= self.cfg.max_preemption_attempts:
                ctx.timely = True  # not looked at: the next cycle must
                return False
            scope = self._preempt_scope(job, t, n)
            if scope is None or not scope[1]:
                continue
            within = scope[0]
            reserved = self._reserved_node(job, t, n, now, ctx)
            if reserved == _WHOLE_TYPE:
                continue
            sig = (*self._preempt_sig(job, t, within), reserved)
            stamp = self._preempt_stamp(t, now)
            if self._preempt_failed.failed(sig, n, stamp):
                continue
            # Waiting out a tier-2 grace is not worth it when running jobs are expected to free
            # enough GPUs before the grace would end: then only victims that stop at once (tier
            # 3, shrinks) are considered, and without them the job waits under a reservation.
            at_once = self._waiting_beats_notice(job, t, n, now, ctx)
            if at_once:
                # Which victims stop at once changes as their unsaved work grows (`_save_over`):
                # then a failed search stands for this cycle only.
                clock = now if self._save_over(Tier.EXPLORATORY, job) else None
                sig += ("at once", clock)
                if self._preempt_failed.failed(sig, n, stamp):
                    continue
            plan = self._plan(job, t, n, within, at_once, now, ctx, reserved)
            if plan is None:
                self._preempt_failed.record(sig, n, stamp)
                continue
            if self.policy.weigh_lost_work and not self._worth_the_lost_work(job, plan, t, n, now):
                ctx.timely = True  # the victims' unsaved work and the wait change with time
                continue
            if deferred is None and self._plan_grace(job, plan) > 0:
                deferred = (plan, within, t)  # first, one that starts at once on another type
                continue
            if deferred is not None and (
                self._plan_grace(job, plan) > 0
                or not self._at_once_beats(job, plan, t, deferred, now)
            ):
                continue
            self._execute(job, plan, within, now, ctx)
            return True
        if deferred is None:
            return False
        plan, within, t = deferred
        ctx.wait_on = self._wait_elsewhere(job, types, t, n, plan, now, ctx)
        if ctx.wait_on is not None:
            ctx.timely = True  # the expected ends and the notice's end move with time
            return False
        self._execute(job, plan, within, now, ctx)
        return True

    def _at_once_beats(
        self, job: Job, plan: PreemptionPlan, gpu_type: str, deferred: tuple, now: float
    ) -> bool:
        """Whether a plan that starts the job at once on `gpu_type` is expected (by walltime
        estimates) to finish it no later than the `deferred` plan on a faster type, whose
        victims first save and stop. Without estimates it is taken: it starts sooner. On
        Alibaba's gpuspec33 an 8-GPU tier-1 pod stopped tier-3 pods on four T4 nodes rather
        than wait a minute for a tier-2 pod's save on G2: 50 h at 0.15 against 21 h at 0.35,
        and the T4s' own tier-1 pods waited behind it."""
        plan_there, _, there = deferred
        n = plan.allocation.gpus
        here = self._est_runtime(job, gpu_type, n)
        if math.isinf(here):
            return True
        return here <= self._plan_wait(job, plan_there, now) + self._est_runtime(job, there, n)

    def _wait_elsewhere(
        self,
        job: Job,
        types: list[str],
        gpu_type: str,
        n: int,
        plan: PreemptionPlan,
        now: float,
        ctx: _Cycle,
    ) -> str | None:
        """Another accepted type on which the job, by walltime estimates, both starts and
        finishes no later by waiting than it would after giving the plan's victims on
        `gpu_type` their notice: running jobs there free `n` GPUs, beyond those the jobs
        already waiting there want, before the notice ends. Then nobody is stopped and the job
        waits for that type (the fastest such). None without estimates to compare, and for
        tier 1: its queueing target (S1) is not traded against estimates that may slip."""
        runtime = self._est_runtime(job, gpu_type, n)
        if math.isinf(runtime) or job.tier == Tier.CORE or not self.policy.tiers:
            return None  # (a policy that ignores tiers does not weigh notices either)
        start_here = now + self._plan_wait(job, plan, now)
        for t in types:
            if t == gpu_type or not self.admissible(job, t, n):
                continue
            start = self.shadow_time(t, n + ctx.waiting.get(t, 0), now)
            if start <= start_here and start + self._est_runtime(job, t, n) <= start_here + runtime:
                return t
        return None

    def _preempt_scope(self, job: Job, gpu_type: str, n: int) -> tuple[bool, bool] | None:
        """None where the job may not preempt for `n` GPUs of the type (no preemption, or a
        tier-1 job that would not fit in the pool); else (whether it runs within its team's
        quota there, whether anybody of a tier it may take from runs there). Asked by the
        hopeless test, the type choice's dry runs and the preemption step alike, so it is
        worked out once per type in a try (nothing changes within a try until it succeeds)."""
        key = (job.id, gpu_type, n)
        scopes = self._ctx.scopes
        if key in scopes:
            return scopes[key]
        scope = None
        if self.policy.preemption and self.admissible(job, gpu_type, n):
            within = self.quota.within(job.team, gpu_type, n * job.spec.gpu_milli, job.tier)
            scope = (within, self.policy.may_have_victims(self, job, gpu_type, within))
        scopes[key] = scope
        return scope

    def _preempt_sig(self, job: Job, gpu_type: str, within: bool) -> tuple:
        """What a preemption search depends on besides the GPU count: jobs that agree on it
        find the same victims (or none)."""
        s = job.spec
        tier = (int(job.tier), job.borrows_at_tier2)
        shape = (gpu_type, s.tp_size, s.max_racks, s.power_profile, s.kind)
        return (shape, tier, within, job.team, self.policy.preempt_key(self, job, gpu_type))

    def preemption_wait(self, job: Job, gpu_type: str, n: int, now: float) -> float | None:
        """How long the job would wait for `n` GPUs of the type by preempting now, by the
        preemption step's own rules (a dry run for policies, see `engine.typechoice`; changes
        nothing): 0 for a plan whose victims stop (or shrink) at once and that is worth their
        lost work, else the expected wait of a plan that gives notice (`_plan_wait`), else
        None. Remembered for the cycle while the type's running set stays the same. Once the
        cycle has made its `max_preemption_attempts` searches, no plan can be carried out
        before the next cycle: then the answer is None, so a job is not held back from free
        GPUs of a slower type for a preemption it cannot make (in a busy queue the same jobs at
        the head spend the budget every cycle)."""
        ctx = self._ctx
        if ctx.attempts >= self.cfg.max_preemption_attempts:
            return None
        scope = self._preempt_scope(job, gpu_type, n)
        if scope is None or not scope[1]:
            return None
        within = scope[0]
        reserved = self._reserved_node(job, gpu_type, n, now, ctx)
        if reserved == _WHOLE_TYPE:
            return None
        key = (self._preempt_sig(job, gpu_type, within), reserved, n)
        hit = ctx.dry_runs.get(key)
        if hit is not None and hit[0] == self._epoch[gpu_type]:
            return hit[1]
        wait = None
        plan = self._plan(job, gpu_type, n, within, True, now, ctx, reserved, count=False)
        if plan is not None and self._plan_grace(job, plan) == 0:
            worth = not self.policy.weigh_lost_work
            if worth or self._worth_the_lost_work(job, plan, gpu_type, n, now):
                wait = 0.0
        if wait is None:
            plan = self._plan(job, gpu_type, n, within, False, now, ctx, reserved, count=False)
            if plan is not None and self._plan_grace(job, plan) > 0:
                wait = self._plan_wait(job, plan, now)
        ctx.dry_runs[key] = (self._epoch[gpu_type], wait)
        return wait

    def _plan(
        self,
        job: Job,
        t: str,
        n: int,
        within: bool,
        at_once: bool,
        now: float,
        ctx: _Cycle,
        reserved: int | None,
        count: bool = True,
    ) -> PreemptionPlan | None:
        """The cheapest preemption plan for `n` GPUs of type `t` for the job, or None (changes
        nothing). `at_once`: only victims that stop (or shrink) without a grace. `reserved`:
        the node a backfill reservation keeps the job off (`_reserved_node`). `count`: the
        search counts towards the cycle's `max_preemption_attempts`."""
        inference = job.spec.kind == JobKind.INFERENCE  # others take from anyone (S9)
        allowed = (
            o
            for group in self._victim_groups(job, t, within, at_once, now, ctx)
            for o in group
            if o.current()  # not stopped, resized or flipped since the list was made
            and (o.at_once or not at_once)
            and (reserved is None or reserved not in o.part.nodes)
            and self._may_take(job, o, within, inference)
        )
        first = next(allowed, None)
        if first is None:
            return None  # nobody to preempt: not a search that counts towards the cap
        ctx.attempts += count
        req = self._request(job, t, n)
        return plan_preemption(
            self.index, req, chain((first,), allowed), self.policy.placement, reserved
        )

    def _reserved_node(
        self, job: Job, gpu_type: str, n: int, now: float, ctx: _Cycle
    ) -> int | None:
        """How the backfill reservation on the type bounds a preemption for `n` GPUs (S6): a
        job walked after the holder may no more delay the reserved start by stopping jobs
        than by taking free GPUs (`_attempt`), unless it ends before the shadow time or fits
        in the spare GPUs. None: no bound; a node: the one held, to stay off; `_WHOLE_TYPE`:
        a count reservation, which bars the type. Not bound: a tier-1 job, which stops lower
        tiers within a cycle (S1), also where it borrows at tier 2 (it keeps tier 1's
        precedence and queueing target; bound too, Alibaba's gpushare20 had a tier-1 P99 of
        14.9 min over seeds 0-3, against 12.2), and an inference surge (S9).
        Before, on Alibaba's gpuspec33 (seed 3) a flexible 2-GPU tier-2 pod stopped two
        tier-3 pods on G3, whose one node an 8-GPU tier-1 pod held a reservation on, and ran
        there for 215 h: the tier-1 pod, and three tier-2 8-GPU pods behind it, waited as
        long."""
        if job.tier == Tier.CORE or job.borrows_at_tier2 or job.spec.kind == JobKind.INFERENCE:
            return None
        res = self._reservation_over(job, gpu_type, ctx)
        if res is None or self._backfill_ok(res, job, gpu_type, n, now):
            return None
        return _WHOLE_TYPE if res.node is None else res.node

    def _may_take(self, job: Job, option: Option, within: bool, inference: bool) -> bool:
        """Whether the job may stop (or shrink) the option's jobs now: none of them is stopping
        already, an inference job takes only what S9 lets it, the policy allows each, and
        nobody joined a shared GPU since the option was made."""
        for v in option.jobs:
            if v.id in self.pending_stops:
                return False
            if inference and not self._inference_may_take(v):
                return False
            if not self.policy.may_preempt(self, job, v, within):
                return False
        if option.jobs[0].spec.gpu_milli >= MILLI:
            return True
        return self.shared.used.get(shared_gpu(option.part)) == sum(
            v.spec.gpu_milli for v in option.jobs
        )

    def _victim_groups(
        self, job: Job, t: str, within: bool, at_once: bool, now: float, ctx: _Cycle
    ) -> Iterator[list[Option]]:
        """The victim options of type `t` worth testing for the job, in cost order: elastic
        jobs that can shrink, then stops by tier, lowest tier first (only the tiers the policy
        may take from; none that waits out a grace when `at_once`). Each list is sorted once
        per cycle, when first needed: every plan of the cycle walks the same lists, taking
        only options still current, so a plan needing a few victims looks at a few."""
        tiers = self.policy.victim_tiers(job, within)
        if self.policy.elastic and self.elastic_running:
            yield self._victim_list(ctx, t, "shrink", 0.0, now, None)
        for k in tiers:
            grace = self._grace_of_tier(k, job)
            if at_once and grace > 0:
                continue
            if self.running_by_tier[(t, k)]:
                yield self._victim_list(
                    ctx, t, k, self.notice_s(grace), now, self._save_over(k, job)
                )

    def _victim_list(
        self,
        ctx: _Cycle,
        t: str,
        group: int | str,
        notice: float,
        now: float,
        save_over: tuple[float, float] | None,
    ) -> list[Option]:
        """The victim options of one group (`victim_options`), each expected to keep its GPUs
        for at most `notice` seconds (those with much unsaved work given time to save instead,
        `save_over`, see `_save_over`); for a tier whose jobs stop at once, also the GPUs that
        jobs of that tier alone share (`_shared_gpu_options`). Kept current through the cycle
        (`_victim_changed`)."""
        key = (t, group, notice, save_over)
        options = ctx.victims.get(key)
        if options is None:
            if group == "shrink":
                jobs = (v for v in self.elastic_running.values() if v.allocation.gpu_type == t)
            else:
                jobs = self.running_by_tier[(t, group)].values()
            members = (v for v in jobs if self._in_victim_group(v, group, now))
            options = victim_options(
                members, group == "shrink", notice, now, self._watts, self._reserves, save_over
            )
            if group != "shrink":
                options += self._shared_gpu_options(t, group, notice, now, save_over)
                options.sort(key=option_key)
            ctx.victims[key] = options
            ctx.victim_index[key] = {v.id: o for o in options for v in o.jobs}
        return options

    def _in_victim_group(self, v: Job, group: int | str, now: float) -> bool:
        """Whether running job `v` is an option of its own in a victim list of `group` (a tier,
        or "shrink"); a fractional job is one only with the others on its GPU
        (`_shared_gpu_option`)."""
        if v.started_at == now or v.spec.gpu_milli < MILLI:
            return False  # never undo a start of this very cycle
        shrinks = self.policy.elastic and v.spec.is_elastic and shrunk_allocation(v) is not None
        if group == "shrink":
            return v.id in self.elastic_running and shrinks
        return int(v.tier) == group and not shrinks

    def _shared_gpu_options(
        self, t: str, tier: int, notice: float, now: float, save_over: tuple[float, float] | None
    ) -> list[Option]:
        """The shared GPUs of type `t` (S11) on which jobs of `tier` run, each as one option
        stopping all its jobs (`_shared_gpu_option`)."""
        if not self.shared.used:
            return []  # no fractional job runs: nothing to look through
        gpus = {
            shared_gpu(v.allocation): None
            for v in self.running_by_tier[(t, tier)].values()
            if v.spec.gpu_milli < MILLI
        }
        options = (
            self._shared_gpu_option(node, gpu, tier, notice, now, save_over) for node, gpu in gpus
        )
        return [o for o in options if o is not None]

    def _shared_gpu_option(
        self,
        node: int,
        gpu: int,
        tier: int,
        notice: float,
        now: float,
        save_over: tuple[float, float] | None,
    ) -> Option | None:
        """GPU `gpu` of `node`, shared by fractional jobs, as a victim option that stops them
        all, each given `notice` (`engine.preemption.shared_gpu_option`), or None unless they
        are all of `tier` and none started in this very cycle. Stopped at once with more than
        `EngineConfig.shared_stop_max_unsaved_s` of unsaved work, they save first where
        `save_over` lets them (a tier-1 preemptor, `_save_over`), else they are no option.
        While they save the GPU is closed to newcomers (`_execute`). Freeing a whole GPU is what
        a preemptor needs; one of its jobs alone frees nothing."""
        sharers = self._sharers(node, gpu)
        if any(int(v.tier) != tier or v.started_at == now for v in sharers):
            return None
        watts, cap = self.shared.watts[(node, gpu)], self.cfg.shared_stop_max_unsaved_s
        save_s = save_over[1] if save_over is not None else None
        return shared_gpu_option(sharers, watts, notice, now, cap, save_s, self._reserves)

    def _sharers(self, node: int, gpu: int) -> tuple[Job, ...]:
        """The fractional jobs running on GPU `gpu` of `node`, in submission order."""
        on_node = (self.running[job_id] for job_id in self.node_jobs[node])
        sharers = [
            v
            for v in on_node
            if v.spec.gpu_milli < MILLI and shared_gpu(v.allocation) == (node, gpu)
        ]
        return tuple(sorted(sharers, key=lambda v: v.seq))

    def _victim_changed(self, job: Job) -> None:
        """A running job's borrowed flag or allocation changed during the cycle: in the victim
        lists already made for its type, put it (or its shared GPU) where a list made now would
        have it (or take it out). So a cycle's decisions do not depend on when its lists were
        first made (a dry run of the type choice can make one early)."""
        ctx = self._ctx
        if not ctx.victims or job.allocation is None:
            return
        t, now = job.allocation.gpu_type, ctx.now
        for key, options in ctx.victims.items():
            if key[0] != t:
                continue
            index = ctx.victim_index[key]
            old = index.get(job.id)
            if old is not None:
                del options[bisect_left(options, old.key, key=option_key)]
                for v in old.jobs:
                    del index[v.id]
            group, notice, save_over = key[1:]
            new: list[Option] = []
            if self._in_victim_group(job, group, now):
                new = victim_options(
                    (job,), group == "shrink", notice, now, self._watts, self._reserves, save_over
                )
            elif job.spec.gpu_milli < MILLI and group == int(job.tier):
                shared = self._shared_gpu_option(
                    *shared_gpu(job.allocation), group, notice, now, save_over
                )
                new = [shared] if shared is not None else []
            for option in new:
                insort(options, option, key=option_key)
                for v in option.jobs:
                    index[v.id] = option

    def _plan_grace(self, job: Job, plan: PreemptionPlan) -> float:
        """How long the job waits for the plan's victims at most: the longest grace among
        them."""
        return max(
            (self._grace(v.job, job) for v in plan.victims if v.shrink_to is None), default=0.0
        )

    def _plan_wait(self, job: Job, plan: PreemptionPlan, now: float) -> float:
        """How long the job is expected to wait for the plan's victims (`notice_wait`)."""
        return max(
            (
                notice_wait(v.job, self.notice_s(self._grace(v.job, job)), now)
                for v in plan.victims
                if v.shrink_to is None
            ),
            default=0.0,
        )

    def _worth_the_lost_work(
        self, job: Job, plan: PreemptionPlan, gpu_type: str, n: int, now: float
    ) -> bool:
        """Whether stopping the plan's victims at once is worth the work they lose.

        A victim stopped without grace keeps only its last checkpoint; the GPU time since then
        is thrown away. The alternative is to wait: the reservation's shadow time (by walltime
        estimates) says when enough GPUs of the type free up anyway. Below tier 1 the job waits
        when the victims would lose more GPU time, times `EngineConfig.lost_work_weight` (2),
        than it would spend waiting (wait x GPUs; weight 1 -> 2 took 0e4a51 from 84.2 to 83.0 h); a
        tier-1 job waits only when it would start within its queueing target anyway
        (`EngineConfig.queue_target_s`, 5 min), so S1's suspension within a cycle stands.
        A plan that loses nothing (shrinks, graceful stops, fresh checkpoints) is always worth
        it."""
        lost = 0.0
        for victim in plan.victims:
            v = victim.job
            if victim.shrink_to is not None or self._grace(v, job) > 0 or v.rate <= 0:
                continue
            lost += v.unsaved_at(now) / v.rate * v.gpu_share
        if lost <= 0:
            return True
        wait = self.shadow_time(gpu_type, n, now) - now
        if job.tier == Tier.CORE:
            return wait > self.cfg.queue_target_s[0]
        return lost * self.cfg.lost_work_weight <= wait * n

    def _changed(self, gpu_type: str, freed: bool) -> None:
        """Note a change of the type's running set or free GPUs, for the caches that depend on
        them (shadow times, dry runs) and, when GPUs were freed, for the failure memos."""
        self._epoch[gpu_type] += 1
        if freed:
            self._freed[gpu_type] += 1

    def _count_start(self, gpu_type: str, tier: int, run: float, now: float) -> None:
        """A job of the tier started on the type, expected to run `run` seconds."""
        counts = self._starts[(gpu_type, tier)]
        for b in range(_run_band(run) + 1):
            counts[b] += 1
        at, k = self._starts_now.get(gpu_type, (None, 0))
        self._starts_now[gpu_type] = (now, k + 1 if at == now else 1)

    def _starts_of(self, gpu_type: str, tiers: tuple[int, ...], band: int = 0) -> int:
        """Jobs of `tiers` started on the type so far (new victims for a job of a policy that
        may stop those tiers), of those expected to run at least 2**`band` seconds."""
        return sum(self._starts[(gpu_type, k)][band] for k in tiers)

    def _starts_at(self, gpu_type: str, now: float) -> int:
        """Jobs started on the type at `now` (no victims until time has passed)."""
        at, k = self._starts_now.get(gpu_type, (None, 0))
        return k if at == now else 0

    def _coupled(self, counter: dict[str, int], gpu_type: str) -> int:
        """A counter summed over the type and the types sharing its racks' power caps; the
        counters only grow, so the sum changes with any of them."""
        return sum(counter[t] for t in self._power_coupled[gpu_type])

    def _stamp(self, gpu_type: str) -> int:
        """What a placement search on the type depends on that can make it succeed later (see
        `engine.memo`): GPUs and rack power freed on it or on a type sharing its racks' power
        caps."""
        return self._coupled(self._freed, gpu_type)

    def _preempt_stamp(self, gpu_type: str, now: float) -> tuple:
        """As `_stamp`, plus what can give a preemption search more victims: jobs started on
        the type before `now` (those started at `now` are no victims yet) and changed borrowed
        flags. A policy whose order changes with time (attained service) may also change whom
        it lets preempt whom, so its failures last one cycle."""
        started = self._starts_of(gpu_type, _TIERS) - self._starts_at(gpu_type, now)
        clock = None if self.policy.incremental else now
        return (self._stamp(gpu_type), started, self._flips[gpu_type], clock)

    def _waiting_beats_notice(
        self, job: Job, gpu_type: str, n: int, now: float, ctx: _Cycle
    ) -> bool:
        """Whether running jobs are expected (by walltime estimates) to free `n` GPUs of the
        type before a tier-2 victim given notice now would have stopped (`notice_s`)."""
        if job.spec.kind == JobKind.INFERENCE or not self.policy.tiers:
            return False  # victims of these stop at once anyway (`_grace`)
        grace = self.notice_s(self.cfg.tier2_grace_s)
        if grace <= 0 or not (
            self.running_by_tier[(gpu_type, 2)] or self.borrowed_by_type[gpu_type]
        ):
            return False
        return self.shadow_time(gpu_type, n, now) <= now + grace

    def shadow_time(self, gpu_type: str, n: int, now: float) -> float:
        """When `n` GPUs of the type are expected to be free for a job that could not be placed
        there, by the running jobs' walltime estimates (EASY, `engine.backfill.reserve`);
        remembered while the type is unchanged. Free GPUs that already suffice in number are
        held by topology, power or a reservation: then only GPUs running jobs release count
        (on Alibaba a tier-1 pod wanting 4 GPUs of one node, with 9 free across nodes, took
        the count for a start "now" and waited 16 min rather than give a tier-2 pod notice)."""
        key = (gpu_type, n)
        cached = self._ctx.shadows.get(key)
        if cached is None or cached[0] != self._epoch[gpu_type]:
            ends = ((e, self.running[j].gpus_held) for e, _, j in self.ends_by_type[gpu_type])
            free = self.index.type_free[gpu_type]
            shadow = expected_free_at(n, free if free < n else 0, ends, now)[0]
            cached = self._ctx.shadows[key] = (self._epoch[gpu_type], shadow)
        return cached[1]

    def _execute(
        self, job: Job, plan: PreemptionPlan, within: bool, now: float, ctx: _Cycle
    ) -> None:
        waiting: set[str] = set()
        for victim in plan.victims:
            v = victim.job
            if job.spec.kind == JobKind.INFERENCE:
                why = f"inference job {job.id} needs the GPUs"
            elif v.borrowed and within and v.team != job.team:
                why = f"reclaimed by team {job.team} for job {job.id}"
            else:
                why = self.policy.preempt_reason(job, v) or (
                    f"tier-{int(job.tier)} job {job.id} needs the GPUs"
                )
            if victim.shrink_to is not None:
                self._resize(v, victim.shrink_to, now, f"shrunk: {why}")
                continue
            grace = self._grace(v, job)
            order = Preempt(v.id, grace, why, for_job=job.id, checkpoint=grace > 0)
            self._decisions.append(order)
            v.preemptions += 1
            ctx.preempted += 1
            if grace == 0:
                self._stop(v, now, keep_all=self.policy.suspend_saves)
                ctx.stopped_at_once = True
            else:
                v.preempting = True
                self.pending_stops[v.id] = order
                self.hold_of[v.id] = job.id
                waiting.add(v.id)
                if v.spec.gpu_milli < MILLI:
                    self.shared.close(*shared_gpu(v.allocation))
        alloc = plan.allocation
        self._book_spare(self._reservation_over(job, alloc.gpu_type, ctx), job, alloc, now)
        if waiting:
            self._hold(job, alloc, waiting)
        else:
            self._start(job, alloc, now)

    def notice_s(self, grace: float) -> float:
        """How long a job given `grace` seconds of notice is expected to keep running: it saves
        its checkpoint and stops (`EngineConfig.notice_stop_s`), and the grace is its deadline."""
        return min(grace, self.cfg.notice_stop_s)

    def _grace(self, victim: Job, job: Job) -> float:
        """The notice `job` gives `victim` (`_grace_of_tier`), or the time a save takes where
        stopping it at once would throw away too much (`_save_over`)."""
        grace = self._grace_of_tier(victim.tier, job)
        save_over = self._save_over(victim.tier, job)
        if victim.spec.gpu_milli < MILLI:
            # Sharers stop at once together, or save together (`_shared_gpu_option`).
            if grace > 0 or save_over is None:
                return grace
            lost = shared_unsaved(self._sharers(*shared_gpu(victim.allocation)), self._ctx.now)
            given = shared_notice(lost, grace, self.cfg.shared_stop_max_unsaved_s, save_over[1])
            return grace if given is None else given
        return notice_given(victim, grace, self._ctx.now, save_over)

    def _save_over(self, tier: int, job: Job) -> tuple[float, float] | None:
        """(cap, save_s) where `job` stops victims of `tier` at once but gives one whose stop
        would throw away more than `cap` of unsaved work `save_s` to save first; else None.

        That is tier 3 for a tier-1 job. S1 has tier-3 jobs suspended within the cycle a
        tier-1 job needs their GPUs; one that saves (`notice_stop_s`, a minute) is suspended
        and loses nothing, so the tier-1 job waits that minute rather than throw away more than
        `EngineConfig.tier1_stop_max_unsaved_s` (1 h) of another team's work. Victims that stop
        at once still go first (`victim_options`). Gavel's msr traces, whose jobs take no
        periodic checkpoints: 7f04ca's GPU-hours lost 13,425 -> 425 and mean JCT 174 -> 146 h
        (seed 0); tier-1 P99 becomes a minute where it was 0 on some lightly loaded traces.
        Not for an inference surge (S9: it cannot wait) nor for policies that do not weigh
        lost work."""
        if (
            tier == Tier.EXPLORATORY
            and job.tier == Tier.CORE
            and job.spec.kind != JobKind.INFERENCE
            and self.policy.tiers
            and self.policy.weigh_lost_work
        ):
            return (self.cfg.tier1_stop_max_unsaved_s, self.cfg.notice_stop_s)
        return None

    def _grace_of_tier(self, tier: int, job: Job) -> float:
        """The notice a victim of `tier` gets from `job`: tier 2 the grace (S1); tier 3 stops at
        once for a tier-1 job (S1: within the cycle; `_grace` says which save first) and
        otherwise is asked to save first, with the minute that takes as its deadline
        (`notice_stop_s`; the unsaved work it would lose is worth more than the preemptor's
        minute); an inference surge cannot wait (S9). A policy that ignores tiers stops
        everyone at once, or, if it suspends by saving (`Policy.suspend_saves`), gives them the
        time a save takes."""
        if job.spec.kind == JobKind.INFERENCE:
            return 0.0
        if not self.policy.tiers:
            return self._suspension_s()
        if tier == Tier.EXPLORATORY and job.tier == Tier.CORE:
            return 0.0
        return self.notice_of_tier(tier)

    def _suspension_s(self) -> float:
        """The notice a policy that ignores tiers gives whomever it stops: the time a save takes
        where it suspends by saving (`Policy.suspend_saves`), else none."""
        return self.cfg.notice_stop_s if self.policy.suspend_saves else 0.0

    def notice_of_tier(self, tier: int) -> float:
        """The deadline of a stop notice to a job of `tier`: the tier-2 grace (S1), or for
        tier 3 the time a save takes (`notice_stop_s`); also what a move gives a job
        (`engine.migration`)."""
        return self.cfg.notice_stop_s if tier == Tier.EXPLORATORY else self.cfg.tier2_grace_s

    @staticmethod
    def _inference_may_take(victim: Job) -> bool:
        """S9: an inference job takes GPUs at once from offline work only: tier-3 or borrowed
        training, never another service and never owned tier-2 work (that needs notice)."""
        return victim.spec.kind == JobKind.TRAINING and (
            victim.tier == Tier.EXPLORATORY or victim.borrowed
        )

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

    def _held_node(self, job: Job, gpu_type: str, ctx: _Cycle) -> int | None:
        """The node of the type that another job's reservation holds (this walk's, else the
        last walk's, which jobs walked before its holder never see: a tier-1 pod stays off
        the node a tier-2 gang waits on where another node has room), if any."""
        res = ctx.reservations.get(gpu_type) or self._reservations.get(gpu_type)
        if res is None or res.node is None or res.job_id == job.id:
            return None
        holder = self.jobs.get(res.job_id)
        return res.node if holder is not None and holder.state == JobState.PENDING else None

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
                        self._start(job, alloc, now)
                        break
        finally:
            self.spares.reclaim()

    def _grow(self, now: float, blocked_types: set[str]) -> None:
        for job in sorted(self.elastic_running.values(), key=lambda j: (j.tier, j.seq)):
            t = job.allocation.gpu_type
            if t in blocked_types or job.id in self.pending_stops or not self.index.type_free[t]:
                continue
            bigger = grown_allocation(self.index, job, self._watts(job))
            if bigger is not None:
                self._resize(job, bigger, now, "grown into free capacity")

    # -- state changes ---------------------------------------------------------------------

    def _watts(self, job: Job, gpu_type: str | None = None) -> float:
        t = gpu_type or job.allocation.gpu_type
        return self.index.watts_per_gpu(t, job.spec.power_profile)

    def _running(self, job_id: str) -> Job:
        job = self.running.get(job_id)
        if job is None:
            raise InvalidInput(f"job {job_id!r} is not running")
        return job

    def _start(self, job: Job, alloc: Allocation, now: float) -> None:
        t = alloc.gpu_type
        w = self._watts(job, t)
        milli = job.spec.gpu_milli
        for node, gpus in alloc.slots:
            if milli < MILLI:
                self.shared.take(node, gpus[0], milli, w)
            else:
                self.index.take(node, gpus_to_mask(gpus), w)
            self.node_jobs[node].add(job.id)
        self._changed(t, freed=False)
        if self.policy.preemption and job.tier != Tier.CORE:
            self._started_at = now  # tier 1 is never a victim (S1)
        job.allocation = alloc
        job.state = JobState.RUNNING
        job.speed = self.speed(job, t)
        restarting = job.first_start is not None
        job.begin_segment(now, self.cfg.restart_overhead_s if restarting else 0.0)
        self.ends_by_type[t].add((job.expected_end_at, job.seq, job.id))
        self._count_start(t, int(job.tier), job.expected_end_at - now, now)
        job.started_at = now
        if job.first_start is None:
            job.first_start = now
        job.queue_s += now - job.queued_since
        self.quota.add(job.team, t, job.tier, job.milli_held)
        self.fair.add(job.team, t, job.milli_held)
        self.running[job.id] = job
        self.running_by_type[t][job.id] = job
        self.running_by_tier[(t, int(job.tier))][job.id] = job
        for faster in self.faster_types(job):
            self.slower_than[faster][job.id] = job
        changed = self._borrowing(job.team, t).add(job)
        if job.spec.is_elastic and self.policy.elastic:
            self.elastic_running[job.id] = job
        self.queue.remove(job)
        self._blocked.pop(job.id, None)
        self._rebalance(job.team, t, changed)
        self._decisions.append(Start(job.id, alloc, job.borrowed))

    def _release(self, job: Job) -> None:
        self._dirty = True
        for faster in self.faster_types(job):
            self.slower_than[faster].pop(job.id, None)
        self._faster.pop(job.id, None)
        alloc = job.allocation
        t = alloc.gpu_type
        self._changed(t, freed=True)
        w = self._watts(job)
        milli = job.spec.gpu_milli
        for node, gpus in alloc.slots:
            if milli < MILLI:
                self.shared.give(node, gpus[0], milli)
            else:
                self.index.give(node, gpus_to_mask(gpus), w)
            self.node_jobs[node].discard(job.id)
        self.quota.add(job.team, t, job.tier, -job.milli_held)
        self.fair.add(job.team, t, -job.milli_held)
        del self.running[job.id]
        del self.running_by_type[t][job.id]
        del self.running_by_tier[(t, int(job.tier))][job.id]
        self.ends_by_type[t].remove((job.expected_end_at, job.seq, job.id))
        self.borrowed_by_type[t].pop(job.id, None)
        changed = self.team_jobs[(job.team, t)].remove(job)
        self.elastic_running.pop(job.id, None)
        job.allocation = None
        job.borrowed = False
        job.preempting = False
        job.started_at = None
        self._rebalance(job.team, t, changed)

    def _borrowing(self, team: str, gpu_type: str) -> Borrowing:
        key = (team, gpu_type)
        book = self.team_jobs.get(key)
        if book is None:
            book = self.team_jobs[key] = Borrowing(self.quota.limit(team, gpu_type))
        return book

    def _rebalance(self, team: str, gpu_type: str, changed: list[Job]) -> None:
        """Apply what a start, stop or resize changed in who runs on borrowed capacity (S2)."""
        if not self.policy.quotas:
            return
        book = self.team_jobs[(team, gpu_type)]
        borrowed = self.borrowed_by_type[gpu_type]
        for job in changed:
            if job.allocation is None:
                continue
            was, job.borrowed = job.borrowed, book.borrowed(job)
            if was != job.borrowed:
                self._flips[gpu_type] += 1
                self._victim_changed(job)
            if job.borrowed:
                borrowed[job.id] = job
            else:
                borrowed.pop(job.id, None)
        self.quota.tier1_excess[(team, gpu_type)] = book.tier1_excess

    def _stop(self, job: Job, now: float, keep_all: bool, demote: bool = False) -> None:
        """Stop a running job and queue it again with the progress its checkpoint kept."""
        job.advance(now)
        job.close_segment(job.progress_s if keep_all else job.saved_progress(now))
        self._release(job)
        job.state = JobState.PENDING
        job.queued_since = now
        if job.borrows_at_tier2:  # queued at its own tier again (`_borrows_at_tier2`)
            job.tier, job.borrows_at_tier2 = Tier.CORE, False
        if demote:
            job.tier = Tier(job.tier + 1)
            job.failure_demoted = True
        job.tier = budget_capped(job.team, job.tier, self.budget)
        self.queue.add(job)
        self._fresh.append(job)

    def _resize(self, job: Job, alloc: Allocation, now: float, reason: str) -> None:
        old = job.allocation
        self._dirty = self._dirty or alloc.gpus < old.gpus
        w = self._watts(job)
        job.advance(now)
        job.close_segment(job.progress_s)
        old_set = {(n, g) for n, gs in old.slots for g in gs}
        new_set = {(n, g) for n, gs in alloc.slots for g in gs}
        for node, gpu in old_set - new_set:
            self.index.give(node, 1 << gpu, w)
        for node, gpu in new_set - old_set:
            self.index.take(node, 1 << gpu, w)
        for node in set(old.nodes) - set(alloc.nodes):
            self.node_jobs[node].discard(job.id)
        for node in alloc.nodes:
            self.node_jobs[node].add(job.id)
        t = alloc.gpu_type
        self._changed(t, freed=True)
        delta = (alloc.gpus - old.gpus) * job.spec.gpu_milli
        self.quota.add(job.team, t, job.tier, delta)
        self.fair.add(job.team, t, delta)
        self.ends_by_type[t].remove((job.expected_end_at, job.seq, job.id))
        book = self.team_jobs[(job.team, t)]
        changed = book.remove(job)
        job.allocation = alloc
        changed += book.add(job)
        job.begin_segment(now)
        self.ends_by_type[t].add((job.expected_end_at, job.seq, job.id))
        for faster in self.faster_types(job):  # a move may gain at the new rate
            self.slower_than[faster][job.id] = job
        self._rebalance(job.team, t, changed)
        self._victim_changed(job)
        self._decisions.append(Resize(job.id, alloc, reason))

    def _hold(self, job: Job, alloc: Allocation, waiting: set[str]) -> None:
        hold = Hold(job, alloc, waiting)
        self.holds[job.id] = hold
        self.queue.remove(job)
        self._blocked.pop(job.id, None)
        self._take_free_part(hold)

    def _take_free_part(self, hold: Hold) -> None:
        self._changed(hold.allocation.gpu_type, freed=False)
        w = self._watts(hold.job, hold.allocation.gpu_type)
        for node, gpus in hold.allocation.slots:
            mask = gpus_to_mask(gpus) & self.index.free_mask[node]
            if mask:
                self.index.take(node, mask, w)
                hold.held.append((node, mask))

    def _victim_gone(self, victim_id: str, now: float) -> None:
        holder = self.hold_of.pop(victim_id, None)
        if holder is None or holder not in self.holds:
            return
        hold = self.holds[holder]
        hold.waiting.discard(victim_id)
        self._take_free_part(hold)
        if not hold.waiting:
            self._give_back(hold)
            del self.holds[holder]
            self._start(hold.job, hold.allocation, now)

    def _cancel_hold(self, hold: Hold) -> None:
        self._give_back(hold)
        del self.holds[hold.job.id]
        for victim_id in hold.waiting:
            self.hold_of.pop(victim_id, None)
        self.queue.add(hold.job)
        self._fresh.append(hold.job)
        self._dirty = True

    def _give_back(self, hold: Hold) -> None:
        self._dirty = True
        self._changed(hold.allocation.gpu_type, freed=True)
        w = self._watts(hold.job, hold.allocation.gpu_type)
        for node, mask in hold.held:
            self.index.give(node, mask, w)
        hold.held.clear()

    def _tier1_can_fit(self, spec) -> bool:
        """A tier-1 job must fit in its team's quota plus the unowned pool of some accepted type
        (it can never be preempted, so it may not hold another team's guarantee); a larger
        tier-1 request runs at tier 2 when tier 1 may not borrow at tier 2. Only types the job
        can run on count."""
        need = spec.elastic_range[0] * spec.gpu_milli
        return any(
            self.quota.tier1_most(spec.team, t) >= need
            for t in self.index.max_size
            if self._runs_on(spec, t)
        )

    def _check_fits(self, spec) -> None:
        accepted = [t for t in self.index.max_size if spec.speed_on(t, 1.0) is not None]
        if not accepted:
            wanted = ", ".join(spec.gpu_types) or "any"
            have = ", ".join(self.index.max_size)
            raise InvalidInput(
                f"job {spec.id!r} accepts GPU types {wanted}; the cluster has {have}"
            )
        need = spec.elastic_range[0]
        best = 0
        for t in accepted:
            key = (t, spec.max_racks)
            if key not in self._max_gang:
                self._max_gang[key] = self.cluster.max_gang(t, spec.max_racks)
            best = max(best, self._max_gang[key])
        if need > best:
            within = f" within {spec.max_racks} rack(s)" if spec.max_racks else ""
            raise InvalidInput(
                f"job {spec.id!r} needs {need} GPUs but at most {best} GPUs of its accepted "
                f"types exist{within}"
            )
        if spec.tp_size > max(self._max_domain[t] for t in accepted):
            raise InvalidInput(
                f"job {spec.id!r}: tp_size {spec.tp_size} is larger than any NVLink domain"
            )
