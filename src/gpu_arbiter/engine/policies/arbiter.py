"""Arbiter's policy: every step on.

Tiers first; within a tier, teams by weighted dominant share (S4), and within a team its jobs by
the discipline of `engine.discipline`: priority queues by attained GPU-time (Tiresias' 2D-LAS),
the shortest remaining walltime estimate first within a queue, then submission
(`ArbiterPolicy(shortest_first=False)`: submission order). Tier-3 work is time-shared: a tier-3
job suspends a running tier-3 job of a lower-priority queue, which saves its checkpoint and
queues again (`ArbiterPolicy(time_share=False)`: never), and a reservation holds GPUs only from
jobs that could not suspend its holder. Placement packs (S5, S6);
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
counted. Tier-1 jobs never move. Jobs of a pinned job's tier or a lower one also move off the
GPUs it waits for, which quotas forbid it to take from them, when that saves it more wait
than it costs them (`migration.make_way`).

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
from gpu_arbiter.engine import discipline
from gpu_arbiter.engine.migration import MoveRules, plan_and_move
from gpu_arbiter.engine.policy import Policy
from gpu_arbiter.engine.typechoice import patient_types

PLAN_DEPTH = 256  # pending jobs considered for the comparative-advantage plan per cycle
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
        time_share: bool = True,
    ) -> None:
        self.plan: dict[str, str] = {}
        self.moves = moves  # None: never move a running job
        self.patient = patient  # wait for a faster type when that finishes sooner
        self.shortest_first = shortest_first  # False: a team's jobs by submission only
        self.time_share = time_share  # False: a tier-3 job never suspends another tier-3 job
        self.moved_at: float | None = None
        self.promised: dict[str, tuple[str, int]] = {}  # tier-2 moves waiting out their grace
        self.dest: dict[str, str] = {}  # type a moved tier-2 job asks for first when requeued
        # By pending job: its accepted types, fastest first, and their speeds (None: one type).
        self._plan_speeds: dict[str, tuple[tuple[str, ...], tuple[float, ...]] | None] = {}
        # By pending job accepting two types: its `_planned_first_key`, which only its tier
        # changes (the other type is its fallback whatever is free).
        self._plan_keys: dict[str, tuple] = {}
        self._plan_jobs: list[Job] = []  # `plan_order`, as made from ...
        self._planned_from: tuple | None = None  # ... this (queue, its version, free GPUs)
        # By running tier-3 job: (its allocation, until when its standing holds, the
        # standing, `discipline.standing`); by type: (its epoch, until when every standing
        # there holds, the GPUs held by standing, team and borrowed flag); the GPUs of victims
        # a standing of a team finds on a type this cycle.
        self._steady: dict[str, tuple[object, float, discipline.Standing]] = {}
        self._held: dict[str, tuple[int, float, dict[tuple, int]]] = {}
        self._victim_gpus: dict[tuple[str, discipline.Standing, str], int] = {}
        # By job: (its progress and attained GPU-time, the standing they give,
        # `discipline.standing`), for pending jobs, whose standing is asked for on every try.
        self._standings: dict[str, tuple[float, float, discipline.Standing]] = {}
        self.now = 0.0

    def rank_key(self, job: Job) -> tuple:
        """Within a team, the discipline's order (`discipline.rank_key`): by priority queue,
        remaining estimate, submission."""
        if not self.shortest_first:
            return super().rank_key(job)
        return discipline.rank_key(job)

    def victim_tiers(self, job: Job, within_quota: bool) -> tuple[int, ...]:
        """The tier rules' tiers, else tier 3 for a job that may time-share and outranks
        somebody by its queue (`discipline.may_beat`): a job in the last queue suspends
        nobody."""
        tiers = super().victim_tiers(job, within_quota)
        if not tiers and self._time_shares(job) and discipline.may_beat(self._standing_of(job)):
            return (Tier.EXPLORATORY,)
        return tiers

    def may_preempt(self, sched, job: Job, victim: Job, within_quota: bool) -> bool:
        """The tier rules (`Policy.may_preempt`), and time-sharing within tier 3: a tier-3 job
        may suspend a tier-3 job of a lower-priority queue (`discipline.outranks`) of a team
        it may displace (`discipline.may_displace`). The victim saves in the minute tier-3
        victims get (`EngineConfig.notice_stop_s`) and goes back in line with its progress."""
        if super().may_preempt(sched, job, victim, within_quota):
            return True
        return (
            self.time_share
            and job.tier == victim.tier == Tier.EXPLORATORY
            and discipline.beats(self._standing_of(job), self._standing(victim))
            and discipline.may_displace(sched.fair.share, job, victim, within_quota)
        )

    def _standing_of(self, job: Job) -> discipline.Standing:
        """`discipline.standing(job)`, worked out again only once the job's progress or
        attained GPU-time changed (a pending job's never does while it waits)."""
        progress, attained = job.progress_s, job.attained_gpu_s
        known = self._standings.get(job.id)
        if known is not None and known[0] == progress and known[1] == attained:
            return known[2]
        s = discipline.standing(job)
        self._standings[job.id] = (progress, attained, s)
        return s

    def _standing(self, victim: Job) -> discipline.Standing:
        """A running job's standing now (`_held_on` worked most of them out)."""
        known = self._steady.get(victim.id)
        if known is not None and known[0] is victim.allocation and self.now < known[1]:
            return known[2]
        return discipline.standing(victim, self.now)

    def preempt_key(self, sched, job: Job, gpu_type: str):
        """For a tier-3 job that may time-share: its queue and remaining-estimate band, which
        decide whom it outranks (`discipline.outranks`), and the teams served less than its
        own, whose jobs it may not suspend (`discipline.may_displace`)."""
        if not self._time_shares(job):
            return None
        fair = sched.fair
        share = fair.share(job.team)
        served_less = frozenset(t for t in fair.alloc if fair.share(t) < share)
        return (self._standing_of(job), served_less)

    def may_have_victims(self, sched, job: Job, gpu_type: str, within_quota: bool) -> bool:
        """The tier rules' victims, or for a job whose only victims are tier-3 jobs it may
        suspend (it outranks them, `discipline.beats`, and may displace their team,
        `discipline.displaces`): whether the type's free GPUs and those such jobs hold (by
        standing, team and borrowed flag, `_held_on`) add up to its size. A job found to have
        none is set aside until a start or a rise on the type (`SchedulerView.reranked`) may
        give it some, or, where it has some but too few (`victims_too_few`), until GPUs free
        up there. Teams' fair shares drifting apart with time alone do not end that wait."""
        if not self._time_shares(job) or super().victim_tiers(job, within_quota):
            return super().may_have_victims(sched, job, gpu_type, within_quota)
        if not sched.running_by_tier[(gpu_type, Tier.EXPLORATORY)]:
            return False
        mine, team = self._standing_of(job), job.team
        key = (gpu_type, mine, team)
        victims = self._victim_gpus.get(key)
        if victims is None:
            share, victims = sched.fair.share, 0
            for (s, owner, borrowed), n in self._held_on(sched, gpu_type).items():
                if discipline.beats(mine, s) and discipline.displaces(
                    share, team, owner, borrowed, within_quota
                ):
                    victims += n
            self._victim_gpus[key] = victims
        need = job.spec.elastic_range[0] - sched.index.type_free[gpu_type]
        return victims > 0 and victims >= need

    def victims_too_few(self, sched, job: Job, gpu_type: str, within_quota: bool) -> bool:
        """A time-sharing job's victims on the type (`may_have_victims`, which counted them
        this cycle) hold some GPUs, but fewer than it misses there."""
        if super().victim_tiers(job, within_quota) or not self._time_shares(job):
            return False
        return self._victim_gpus.get((gpu_type, self._standing_of(job), job.team), 0) > 0

    def passes_reservation(self, sched, job: Job, holder: Job) -> bool:
        """A tier-3 job is not held back by the reservation of a tier-3 job it outranks
        (`discipline.outranks`, rule 6): the discipline puts it first, whatever the walk's
        team order made of the holder's turn."""
        return self.time_share and discipline.outranks(job, holder, self.now)

    def preempt_reason(self, job: Job, victim: Job) -> str | None:
        if job.tier == victim.tier == Tier.EXPLORATORY:
            return (
                f"tier-3 job {job.id} needs the GPUs: it is in a higher-priority queue"
                " (least service first)"
            )
        return None

    def _time_shares(self, job: Job) -> bool:
        return self.time_share and job.tier == Tier.EXPLORATORY

    def before_cycle(self, sched, now: float) -> None:
        self.plan = {}
        self.now = now
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
        speeds, keys = self._plan_speeds, self._plan_keys
        if len(speeds) > 4 * PLAN_DEPTH:  # forget jobs that left the queue
            self._plan_speeds = speeds = {k: v for k, v in speeds.items() if k in queue}
            self._plan_keys = keys = {k: v for k, v in keys.items() if k in queue}
        order = []
        key, pending = self._planned_first_key, JobState.PENDING
        for j in head:
            by_speed = speeds.get(j.id, ())
            if by_speed == ():
                types = tuple(sched.types_by_speed(j))
                by_speed = (types, tuple(sched.speed(j, t) for t in types))
                by_speed = speeds[j.id] = by_speed if len(types) > 1 else None
            if by_speed is None or j.state != pending:
                continue
            k = keys.get(j.id)
            if k is None or k[2] != j.tier:  # (a job accepting more types: never kept)
                k = key(j, *by_speed, free)
                if len(by_speed[0]) == 2:
                    keys[j.id] = k
            order.append((k, j))
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
        if len(types) == 2:
            fallback = speeds[1]  # the other type, with room or without
        else:
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
        if plan_and_move(sched, now, reservations, self.moves, self.promised, self.placement):
            self.moved_at = now
        self.dest.update((j, t) for j, (t, _) in self.promised.items())

    def note_time(self, sched, now: float) -> None:
        """Tell the scheduler of the types on which a running tier-3 job rose into a
        lower-priority queue since the last cycle: it may be a victim now. Only while tier-3
        jobs wait (the only ones it may give a victim), and only on types where a standing
        may have changed since they were counted (`_held_on`); jobs started since then were
        looked at by the jobs waiting anyway, as their start made them victims, and counted.
        A rise is seen at the next cycle, which arrivals and ends bring, not woken for."""
        self.now = now
        self._victim_gpus = {}
        if not self.time_share or not any(
            tier == Tier.EXPLORATORY for tier, _ in sched.queue.groups
        ):
            return
        if len(self._steady) > 2 * len(sched.running) + 64:  # forget jobs that stopped
            self._steady = {k: v for k, v in self._steady.items() if k in sched.running}
        if len(self._standings) > 2 * len(sched.queue) + 64:  # forget jobs that started
            self._standings = {k: v for k, v in self._standings.items() if k in sched.queue}
        for t, (_, until, _) in list(self._held.items()):
            if now >= until:
                self._held_on(sched, t)

    def _held_on(self, sched, gpu_type: str) -> dict[tuple, int]:
        """The GPUs running tier-3 jobs on the type hold, by their standing now, team and
        borrowed flag (for `may_have_victims`; a flag changes only with a start, stop, resize
        or tier change of the team there, which changes the type's epoch), counted again only
        once the type changed or a standing there may have (`discipline.standing_until`); where
        a job's queue rose, the type is `reranked`."""
        epoch, now = sched.type_epoch(gpu_type), self.now
        known = self._held.get(gpu_type)
        if known is not None and known[0] == epoch and now < known[1]:
            return known[2]
        held: dict[tuple, int] = {}
        steady, until, rose = self._steady, math.inf, False
        for v in sched.running_by_tier[(gpu_type, Tier.EXPLORATORY)].values():
            alloc = v.allocation
            known = steady.get(v.id)
            if known is None or known[0] is not alloc or now >= known[1]:
                s, steady_s = discipline.standing_until(v, now)
                if known is not None and s[0] > known[2][0]:
                    rose = True
                known = steady[v.id] = (alloc, steady_s, s)
            if known[1] < until:
                until = known[1]
            k = (known[2], v.team, v.borrowed)
            held[k] = held.get(k, 0) + alloc.gpus
        if rose:
            sched.reranked(gpu_type)
        self._held[gpu_type] = (sched.type_epoch(gpu_type), until, held)
        return held

    def next_wakeup(self, sched, now: float) -> float | None:
        # GPUs a move left behind go to pending jobs in a cycle right after this one.
        return now if self.moved_at == now else None
