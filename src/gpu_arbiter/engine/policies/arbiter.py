"""Arbiter's policy: every step on.

Tiers first; within a tier, teams by weighted dominant share (S4), and within a team its jobs
shortest first: by the GPU time their walltime estimate says is left (estimate x share of the
work not done x GPUs), then by submission; jobs without an estimate come after those with one,
in submission order. A team's queue is its own to order (S4 orders teams, not jobs), and
shortest-first is what lowers mean JCT when the queue is long; a long
job can be passed by a team's stream of shorter ones, as in any SJF
(`ArbiterPolicy(shortest_first=False)`: submission order). Placement packs (S5, S6);
a blocked job preempts by tier or reclaims borrowed capacity (S1, S2), shrinking elastic jobs
before stopping anyone (S8); otherwise it gets an EASY reservation that backfill honours (S6).
A gang that must sit on one node reserves the node expected to have room for it first, not a
count of the type's GPUs (`Policy.reserve_nodes`): jobs walked after it that would delay it
go to other nodes (or wait), and jobs walked before it keep off the node where another has
room. A reservation by count would hold every GPU of the type from small jobs behind a gang
while it waits for one node to drain, and small jobs spread over every node would keep the
gang waiting. Any other job blocked
although enough GPUs are free by count holds none back (`Policy.reserve_fragmented`).
Flexible jobs start on a slower GPU type when the fast one is wanted by jobs pinned to it (S7):
the roomiest fast-enough one that pinned jobs do not want too.

When pending jobs accept several GPU types and want more of the fast ones than are free, who
gets the fast GPUs is decided by comparative advantage (as in Gavel): each cycle the pending
jobs are planned onto the free GPUs in order of how much faster their fastest type is than the
type they would get without it (the fastest other one with room for them, else their slowest),
so a job that gains 6x from a V100 gets it before one that gains 2x; tier-1 jobs are planned
first, as they never move off the type they start on. The plan only picks the type a
job tries first; the order in which jobs start (tier, fair share) is unchanged.

A preemption that would throw away a victim's uncheckpointed work is weighed against the
preemptor's expected wait (`engine.preemption.plan`), and a plan whose victims stop at
once on another accepted type is preferred to one that waits out a tier-2 grace. Within a tier,
victims are taken by least work lost first, borrowed before owned only among equals
(`engine.preemption`): without checkpoints a stop throws away everything since the start.

After the walk, tier-2 and tier-3 jobs running on a slow type move onto a faster accepted type
the walk left free when that is expected to finish them sooner, the save and restart included
(`engine.migration`, S7): they are asked to checkpoint and stop (tier 3 within the minute a
save takes, tier 2 within its grace) and are started on the promised type when they are
queued again. Where jobs cannot save on notice, a tier-3 job moves at once, its lost work
counted. Tier-1 jobs never move.

Before taking a slow type, a pending job compares its expected finish there with waiting for
(or preempting on) a faster one (`engine.typechoice`): it waits only within its tier's queueing
target, so a tier-1 job still starts within one cycle when no faster type is in sight.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from itertools import islice
from operator import itemgetter

from gpu_arbiter.domain import Job, JobState, Tier
from gpu_arbiter.engine.migration import MoveRules, plan_and_move
from gpu_arbiter.engine.policy import Policy
from gpu_arbiter.engine.typechoice import patient_types

PLAN_DEPTH = 256  # pending jobs considered for the comparative-advantage plan per cycle
# Shortest remaining time first within tier 3: a tier-3 job may stop a tier-3 job expected to
# run at least this many times as long as it would itself on that type (see `may_preempt`).
STOP_LONGER = 8.0
WALK_LIMIT = 64  # running jobs looked at before a search for such victims (see below)
DEFAULT_MOVES = MoveRules()


class ArbiterPolicy(Policy):
    name = "arbiter"
    weigh_lost_work = True
    reserve_fragmented = False
    reserve_nodes = True

    def __init__(
        self,
        moves: MoveRules | None = DEFAULT_MOVES,
        patient: bool = True,
        shortest_first: bool = True,
        stop_longer: float | None = STOP_LONGER,
    ) -> None:
        self.plan: dict[str, str] = {}
        self.moves = moves  # None: never move a running job
        self.patient = patient  # wait for a faster type when that finishes sooner
        self.shortest_first = shortest_first  # False: a team's jobs by submission only
        self.stop_longer = stop_longer  # None: a tier-3 job never stops another tier-3 job
        self._horizons: dict[tuple[str, str], float] = {}  # `_horizon`s of this cycle
        self.moved_at: float | None = None
        self.promised: dict[str, tuple[str, int]] = {}  # tier-2 moves waiting out their grace
        self.dest: dict[str, str] = {}  # type a moved tier-2 job asks for first when requeued
        # By pending job: its accepted types, fastest first, and their speeds (None: one type).
        self._plan_speeds: dict[str, tuple[tuple[str, ...], tuple[float, ...]] | None] = {}
        self._plan_jobs: list[Job] = []  # `plan_order`, as made from ...
        self._planned_from: tuple | None = None  # ... this (queue, its version, free GPUs)
        self.now = 0.0

    def rank_key(self, job: Job) -> tuple:
        """Shortest first within a team: GPU time left by the walltime estimate (read when the
        job is queued, so a stopped job counts what its checkpoint kept), then submission."""
        spec = job.spec
        if not self.shortest_first:
            return super().rank_key(job)
        if spec.walltime_s is None:
            return (math.inf, spec.submit_s)
        left = spec.walltime_s * max(0.0, 1 - job.progress_s / spec.duration_s)
        return (left * spec.gpus, spec.submit_s)

    def victim_tiers(self, job: Job, within_quota: bool) -> tuple[int, ...]:
        tiers = super().victim_tiers(job, within_quota)
        if not tiers and self._stops_longer(job):
            return (Tier.EXPLORATORY,)
        return tiers

    def may_preempt(self, sched, job: Job, victim: Job, within_quota: bool) -> bool:
        """The tier rules (`Policy.may_preempt`), and shortest remaining time first within tier
        3: a tier-3 job may stop a tier-3 job expected (by walltime estimates) to run at least
        `stop_longer` times as long as it would itself on that type (`_horizon`). The victim
        saves in the minute tier-3 victims get (`EngineConfig.notice_stop_s`) and goes back in
        line. Without an estimate a victim counts as running for ever. Only some victims
        (`_may_displace`): its own team's, or those of a team served at least as well (S4); and
        a job beyond its team's quota displaces only borrowers and its own team, as a borrower
        taking a guaranteed job's GPUs would be reclaimed at once (else the same jobs are
        stopped again and again). It lowers mean JCT where short jobs queue behind long
        ones, at a small cost in makespan."""
        if super().may_preempt(sched, job, victim, within_quota):
            return True
        return (
            victim.tier == Tier.EXPLORATORY
            and self._stops_longer(job)
            and self._may_displace(sched, job, victim, within_quota)
            and victim.expected_end_at >= self._horizon(sched, job, victim.allocation.gpu_type)
        )

    @staticmethod
    def _may_displace(sched, job: Job, victim: Job, within_quota: bool) -> bool:
        if victim.team == job.team:
            return True
        if not (within_quota or victim.borrowed):
            return False
        return sched.fair.share(victim.team) >= sched.fair.share(job.team)

    def preempt_key(self, sched, job: Job, gpu_type: str):
        """For a tier-3 job that may stop longer ones: its time left (`_time_left`) and the
        teams served less than its own, whose jobs it may not stop (`_may_displace`)."""
        if not self._stops_longer(job):
            return None
        fair = sched.fair
        share = fair.share(job.team)
        served_less = frozenset(t for t in fair.alloc if fair.share(t) < share)
        return (self._time_left(sched, job, gpu_type), served_less)

    def victim_min_run(self, sched, job: Job, gpu_type: str, within_quota: bool) -> float:
        """A job that may stop tier-3 jobs only for running far longer (`may_preempt`) waits
        for a start expected to outlast its horizon: one that starts later and ends after the
        horizon then runs at least as long as the horizon is from now."""
        if not self._stops_only_longer(job, within_quota):
            return 0.0
        return self._horizon(sched, job, gpu_type) - self.now

    def may_have_victims(self, sched, job: Job, gpu_type: str, within_quota: bool) -> bool:
        if not super().may_have_victims(sched, job, gpu_type, within_quota):
            return False
        if not self._stops_only_longer(job, within_quota):
            return True
        return self._longer_jobs_hold_enough(sched, job, gpu_type, within_quota)

    def _longer_jobs_hold_enough(self, sched, job: Job, gpu_type: str, within_quota: bool) -> bool:
        """Whether the type's free GPUs and those of the tier-3 jobs there that the job may
        stop for running far longer (`may_preempt`) add up to its size. Most tier-3 jobs find
        too few, and a walk back from the latest expected end, which stops at the first job
        not long enough, costs far less than a search of every tier-3 job there. After
        `WALK_LIMIT` jobs (other tiers run long too) the search decides. Jobs started this
        cycle count too (the search passes them over until the next one), so that a job found
        to have no victims need only be looked at again once a tier-3 job expected to outlast
        its horizon starts on the type (`victim_min_run`) or its team releases GPUs there
        (`engine.memo`), not when fair shares shift."""
        need = job.spec.elastic_range[0] - sched.index.type_free[gpu_type]
        horizon = self._horizon(sched, job, gpu_type)
        for looked, (end, _, job_id) in enumerate(reversed(sched.ends_by_type[gpu_type])):
            if end < horizon:
                return False
            v = sched.running[job_id]
            if (
                v.tier == Tier.EXPLORATORY
                and job_id not in sched.pending_stops
                and self._may_displace(sched, job, v, within_quota)
            ):
                need -= v.gpus_held
            if need <= 0 or looked >= WALK_LIMIT:
                return True
        return False

    def preempt_reason(self, job: Job, victim: Job) -> str | None:
        if job.tier == victim.tier == Tier.EXPLORATORY:
            return (
                f"tier-3 job {job.id} needs the GPUs: it has at most 1/{self.stop_longer:g}"
                " as long left to run (shortest first)"
            )
        return None

    def _stops_longer(self, job: Job) -> bool:
        return (
            self.stop_longer is not None
            and job.tier == Tier.EXPLORATORY
            and job.spec.walltime_s is not None
        )

    def _stops_only_longer(self, job: Job, within_quota: bool) -> bool:
        """Whether the job's only victims are tier-3 jobs running far longer: the tier rules
        give it none (`Policy.victim_tiers`), and it may stop longer ones."""
        return self._stops_longer(job) and not super().victim_tiers(job, within_quota)

    def _horizon(self, sched, job: Job, gpu_type: str) -> float:
        """Victims on the type must be expected to run until at least this time. Asked for
        every victim a search looks at, and the same all cycle (a pending job makes no
        progress), so it is worked out once per job and type in a cycle."""
        key = (job.id, gpu_type)
        horizon = self._horizons.get(key)
        if horizon is None:
            horizon = self.now + self.stop_longer * self._time_left(sched, job, gpu_type)
            self._horizons[key] = horizon
        return horizon

    @staticmethod
    def _time_left(sched, job: Job, gpu_type: str) -> float:
        """How long the job would run on the type at its full size by its walltime estimate,
        rounded down to a power of two: jobs of one band find the same victims, so a failed
        search is remembered for them all (`engine.preemption.eligibility`)."""
        run = sched.est_runtime(job, gpu_type, job.spec.gpus)
        return 2.0 ** math.floor(math.log2(max(run, 1.0)))

    def before_cycle(self, sched, now: float) -> None:
        self.plan = {}
        self.now = now
        self._horizons.clear()
        if len(sched.index.type_total) < 2 or not len(sched.queue) or not sched.index.total_free:
            return  # nothing to plan onto
        left = dict(sched.index.type_free)
        if max(left.values()) < sched.queue.smallest():
            return  # no pending job fits in the free GPUs of any one type
        unplanned = sched.index.total_free
        for j in self.plan_order(sched):
            n = j.spec.elastic_range[0]
            for t in sched.types_by_speed(j):
                if left.get(t, 0) >= n:
                    self.plan[j.id] = t
                    left[t] -= n
                    unplanned -= n
                    break
            if not unplanned:
                break  # every job takes at least one GPU

    def plan_order(self, sched) -> list[Job]:
        """The jobs the plan considers, in the order it takes them: the same while the queue
        and the free GPUs are (a cycle often follows one that started nobody)."""
        queue, free = sched.queue, sched.index.type_free
        made_from = (queue, queue.version, tuple(free.values()))
        if self._planned_from == made_from:
            return self._plan_jobs
        # The head of the queue only: deep jobs cannot get GPUs this cycle anyway. A queue
        # no deeper than that is all head, in any order (the plan sorts it).
        if len(queue) <= PLAN_DEPTH:
            head: Iterable[Job] = queue.jobs()
        else:
            head = islice(queue.in_group_order(), PLAN_DEPTH)
        speeds = self._plan_speeds
        if len(speeds) > 4 * PLAN_DEPTH:  # forget jobs that left the queue
            self._plan_speeds = speeds = {k: v for k, v in speeds.items() if k in queue}
        order = []
        for j in head:
            if j.id not in speeds:
                types = tuple(sched.types_by_speed(j))
                by_speed = (types, tuple(sched.speed(j, t) for t in types))
                speeds[j.id] = by_speed if len(types) > 1 else None
            if speeds[j.id] is not None and j.state == JobState.PENDING:
                order.append((self._planned_first_key(j, *speeds[j.id], free), j))
        order.sort(key=itemgetter(0))
        self._plan_jobs = [j for _, j in order]
        self._planned_from = made_from
        return self._plan_jobs

    @staticmethod
    def _planned_first_key(
        j: Job, types: tuple[str, ...], speeds: tuple[float, ...], free: dict[str, int]
    ) -> tuple:
        """Where the plan takes the job (`types` fastest first, at `speeds`): tier 1 first (it
        never moves off its type), then by comparative advantage, most first: its fastest
        type's speed over that of the fastest other type with room for it now (the slowest
        when none has), what it would run at without the fast one: of two jobs wanting the
        last fast node, the one that gains more over the type it would otherwise get goes
        there (not the one that gains more over the slowest type)."""
        n = j.spec.elastic_range[0]
        room = (s for t, s in zip(types[1:], speeds[1:], strict=True) if free[t] >= n)
        fallback = next(room, speeds[-1])
        return (j.tier != Tier.CORE, -speeds[0] / fallback, j.tier, j.seq)

    def candidate_types(self, sched, job: Job) -> list[str]:
        types = self._planned_first(sched, job, self.dest.pop(job.id, None))
        return patient_types(sched, job, types, self.now) if self.patient else types

    def types_when_hopeless(self, sched, job: Job) -> list[str] | None:
        # With no accepted type free enough, the type choice keeps the order (nothing to
        # choose between). A move's destination is `candidate_types`' to take.
        if job.id in self.dest:
            return None
        return self._planned_first(sched, job, None)

    def _planned_first(self, sched, job: Job, dest: str | None) -> list[str]:
        """The accepted types fastest first, but the plan's type first, or the destination
        of a tier-2 job that stopped to move (engine.migration) where it is free enough."""
        types = sched.types_by_speed(job)
        planned = self.plan.get(job.id)
        if dest is not None and dest in types and sched.index.type_free[dest] >= job.gpus_held:
            planned = dest
        if planned is not None and planned != types[0]:
            types = [planned] + [t for t in types if t != planned]
        return types

    def after_walk(self, sched, now: float, reservations: dict) -> None:
        if self.moves is None:
            return
        if plan_and_move(sched, now, reservations, self.moves, self.promised):
            self.moved_at = now
        self.dest.update((j, t) for j, (t, _) in self.promised.items())

    def next_wakeup(self, sched, now: float) -> float | None:
        # GPUs a move left behind go to pending jobs in a cycle right after this one.
        return now if self.moved_at == now else None
