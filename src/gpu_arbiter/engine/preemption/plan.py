"""Whether to preempt at all, the plan search, and the choice between plans.

A plan is the cheapest set of victims (in `victims.option_key` order) whose GPUs let the gang be
placed. Candidates are released tentatively in the capacity index until the gang fits; victims
whose GPUs the gang does not use are then spared (unless the rack power they free is needed),
and the index is restored: the plan changes nothing by itself. A plan is not carried out when
waiting is expected to be better: stopping victims at once throws away more work than the
preemptor would spend waiting (`_worth_the_lost_work`); running jobs free the GPUs before a
notice would end (`_waiting_beats_notice`); another type starts and finishes the job no later
by waiting (`_wait_elsewhere`). A tier-1 job that could start at once on free GPUs of another
type never waits to spare a victim's work (`_starts_elsewhere`). A plan that starts at once on
one type goes before one that waits out a notice on a faster type when it is expected to finish
no later (`_at_once_beats`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain

from gpu_arbiter.domain import Allocation, Job, JobKind, Preempt, Tier
from gpu_arbiter.engine.capacity import CapacityIndex
from gpu_arbiter.engine.context import CycleContext
from gpu_arbiter.engine.placement import Request, gpus_to_mask, place
from gpu_arbiter.engine.preemption.victims import Option
from gpu_arbiter.engine.reservations import WHOLE_TYPE


class PreemptionStep:
    """The preemption step of a pending job's try (mixed into `Scheduler`)."""

    def _try_preempt(
        self, job: Job, types: list[str], n: int, now: float, ctx: CycleContext
    ) -> bool:
        deferred: tuple[PreemptionPlan, bool, str] | None = None
        for t in types:
            if ctx.attempts >= self.cfg.max_preemption_attempts:
                ctx.timely = True  # not looked at: the next cycle must
                return False
            scope = self._preempt_scope(job, t, n, ctx)
            if scope is None or not scope[1]:
                continue
            within = scope[0]
            reserved = self._reserved_node(job, t, n, now, ctx)
            if reserved == WHOLE_TYPE:
                continue
            sig = (*self._preempt_sig(job, t, within, ctx.view), reserved)
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
                clock = now if self._save_over(Tier.EXPLORATORY, job, t) else None
                sig += ("at once", clock)
                if self._preempt_failed.failed(sig, n, stamp):
                    continue
            plan = self._plan(job, t, n, within, at_once, now, ctx, reserved)
            if plan is None:
                self._preempt_failed.record(sig, n, stamp)
                continue
            weigh = self.policy.weigh_lost_work
            if weigh and not self._worth_the_lost_work(job, plan, t, n, now, ctx):
                ctx.timely = True  # the victims' unsaved work and the wait change with time
                continue
            if deferred is None and self._plan_grace(job, plan, now) > 0:
                deferred = (plan, within, t)  # first, one that starts at once on another type
                continue
            if deferred is not None and (
                self._plan_grace(job, plan, now) > 0
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
        victims first save and stop. Without estimates it is taken: it starts sooner. A short
        wait for a save on a fast type beats starting at once on a type that runs the job
        several times slower."""
        plan_there, _, there = deferred
        n = plan.allocation.gpus
        here = self.est_runtime(job, gpu_type, n)
        if math.isinf(here):
            return True
        return here <= self._plan_wait(job, plan_there, now) + self.est_runtime(job, there, n)

    def _wait_elsewhere(
        self,
        job: Job,
        types: list[str],
        gpu_type: str,
        n: int,
        plan: PreemptionPlan,
        now: float,
        ctx: CycleContext,
    ) -> str | None:
        """Another accepted type on which the job, by walltime estimates, both starts and
        finishes no later by waiting than it would after giving the plan's victims on
        `gpu_type` their notice: running jobs there free `n` GPUs, beyond those the jobs
        already waiting there want, before the notice ends. Then nobody is stopped and the job
        waits for that type (the fastest such). None without estimates to compare, and for
        tier 1: its queueing target (S1) is not traded against estimates that may slip."""
        runtime = self.est_runtime(job, gpu_type, n)
        if math.isinf(runtime) or job.tier == Tier.CORE or not self.policy.tiers:
            return None  # (a policy that ignores tiers does not weigh notices either)
        start_here = now + self._plan_wait(job, plan, now)
        for t in types:
            if t == gpu_type or not self.admissible(job, t, n):
                continue
            start = self.shadow_time(t, n + ctx.waiting.get(t, 0), now, ctx)
            if start <= start_here and start + self.est_runtime(job, t, n) <= start_here + runtime:
                return t
        return None

    def preemption_wait(
        self, job: Job, gpu_type: str, n: int, now: float, ctx: CycleContext
    ) -> float | None:
        """How long the job would wait for `n` GPUs of the type by preempting now, by the
        preemption step's own rules (a dry run for policies, see `engine.typechoice`; changes
        nothing): 0 for a plan whose victims stop (or shrink) at once and that is worth their
        lost work, else the expected wait of a plan that gives notice (`_plan_wait`), else
        None. Remembered for the cycle while the type's running set stays the same. Once the
        cycle has made its `max_preemption_attempts` searches, no plan can be carried out
        before the next cycle: then the answer is None, so a job is not held back from free
        GPUs of a slower type for a preemption it cannot make (in a busy queue the same jobs at
        the head spend the budget every cycle)."""
        if ctx.attempts >= self.cfg.max_preemption_attempts:
            return None
        scope = self._preempt_scope(job, gpu_type, n, ctx)
        if scope is None or not scope[1]:
            return None
        within = scope[0]
        reserved = self._reserved_node(job, gpu_type, n, now, ctx)
        if reserved == WHOLE_TYPE:
            return None
        key = (self._preempt_sig(job, gpu_type, within, ctx.view), reserved, n)
        hit = ctx.dry_runs.get(key)
        if hit is not None and hit[0] == self._epoch[gpu_type]:
            return hit[1]
        wait = None
        plan = self._plan(job, gpu_type, n, within, True, now, ctx, reserved, count=False)
        if plan is not None and self._plan_grace(job, plan, now) == 0:
            worth = not self.policy.weigh_lost_work
            if worth or self._worth_the_lost_work(job, plan, gpu_type, n, now, ctx):
                wait = 0.0
        if wait is None:
            plan = self._plan(job, gpu_type, n, within, False, now, ctx, reserved, count=False)
            if plan is not None and self._plan_grace(job, plan, now) > 0:
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
        ctx: CycleContext,
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
            for group in self._victim_groups(job, t, within, at_once, now)
            for o in group
            if o.current()  # not stopped, resized or flipped since the list was made
            and (o.at_once or not at_once)
            and (reserved is None or reserved not in o.part.nodes)
            and (not self.drained or self.drained.isdisjoint(o.part.nodes))
            and self._may_take(job, o, within, inference, ctx.view)
        )
        first = next(allowed, None)
        if first is None:
            return None  # nobody to preempt: not a search that counts towards the cap
        ctx.attempts += count
        req = self._request(job, t, n)
        return plan_preemption(
            self.index, req, chain((first,), allowed), self.policy.placement, reserved
        )

    def _worth_the_lost_work(
        self, job: Job, plan: PreemptionPlan, gpu_type: str, n: int, now: float, ctx: CycleContext
    ) -> bool:
        """Whether stopping the plan's victims at once is worth the work they lose.

        A victim stopped without grace keeps only its last checkpoint; the GPU time since then
        is thrown away. The alternative is to wait: the reservation's shadow time (by walltime
        estimates) says when enough GPUs of the type free up anyway. Below tier 1 the job waits
        when the victims would lose more GPU time, times `EngineConfig.lost_work_weight` (2),
        than it would spend waiting (wait x GPUs); a tier-1 job waits only when it would start
        within its queueing target anyway (`EngineConfig.queue_target_s`, 5 min), so S1's
        suspension within a cycle stands, and never while it could start at once on free GPUs
        of another type (`_starts_elsewhere`). A plan that loses nothing (shrinks, graceful
        stops, fresh checkpoints) is always worth it."""
        lost = 0.0
        for victim in plan.victims:
            v = victim.job
            if victim.shrink_to is not None or self._grace(v, job, now) > 0 or v.rate <= 0:
                continue
            lost += v.unsaved_at(now) / v.rate * v.gpu_share
        if lost <= 0:
            return True
        if job.tier == Tier.CORE and self._starts_elsewhere(job, gpu_type):
            return True
        wait = self.shadow_time(gpu_type, n, now, ctx) - now
        if job.tier == Tier.CORE:
            return wait > self.cfg.queue_target_s[0]
        return lost * self.cfg.lost_work_weight <= wait * n

    def _starts_elsewhere(self, job: Job, gpu_type: str, min_speed: float = 0.0) -> bool:
        """Whether the job could start at once on free GPUs of an accepted type other than
        `gpu_type`, as far as its quota and the pool let it (`admissible`), running there at
        least `min_speed` times its speed on `gpu_type`: a tier-1 job that could never waits
        for `gpu_type` to spare a victim's unsaved work (`_worth_the_lost_work`), nor, on a
        type fast enough for it (S7), for a victim's save (`_save_over`): it would then wait
        by choice. Other types' free GPUs do not change while the victims on `gpu_type`
        stop, so the answer holds from a plan to its execution."""
        n = job.spec.elastic_range[0]
        free = self.index.type_free
        floor = min_speed * self.speed(job, gpu_type)
        return any(
            t != gpu_type
            and free[t] >= n
            and self.admissible(job, t, n)
            and self.speed(job, t) >= floor
            for t in job.types
        )

    def _waiting_beats_notice(
        self, job: Job, gpu_type: str, n: int, now: float, ctx: CycleContext
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
        return self.shadow_time(gpu_type, n, now, ctx) <= now + grace

    def _execute(
        self, job: Job, plan: PreemptionPlan, within: bool, now: float, ctx: CycleContext
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
                self.state.resize(v, victim.shrink_to, now, f"shrunk: {why}")
                continue
            grace = self._grace(v, job, now)
            order = Preempt(v.id, grace, why, for_job=job.id, checkpoint=grace > 0)
            ctx.preempted += 1
            if grace == 0:
                self.state.stop_now(v, order, now)
                ctx.stopped_at_once = True
            else:
                self.state.give_notice(v, order, holder=job.id)
                waiting.add(v.id)
        alloc = plan.allocation
        self._book_spare(self._reservation_over(job, alloc.gpu_type, ctx), job, alloc, now)
        if waiting:
            self.state.hold(job, alloc, waiting)
        else:
            self.state.start(job, alloc, now)


@dataclass(slots=True)
class Victim:
    job: Job
    shrink_to: Allocation | None  # None: stop the job; else: shrink it to this allocation


@dataclass(slots=True)
class PreemptionPlan:
    allocation: Allocation
    victims: list[Victim]


def plan_preemption(
    index: CapacityIndex,
    req: Request,
    options: Iterable[Option],
    strategy: str,
    avoid: int | None = None,
) -> PreemptionPlan | None:
    """The cheapest victims whose GPUs let `req` be placed, or None; none on node `avoid` (a
    backfill reservation holds it). `options` are the allowed victims cheapest first; they are
    taken lazily, so a plan that needs a few victims looks at a few, however many jobs run.
    None is released in the capacity index before enough are taken to free the gang's GPUs by
    count: when even all of them are too few (the common failed search in a busy cluster), the
    search ends without touching the index."""
    options = iter(options)
    enough: list[Option] = []  # the cheapest options whose GPUs add up to the gang's
    short = req.gpus - index.type_free[req.gpu_type]
    while short > 0:
        option = next(options, None)
        if option is None:
            return None
        enough.append(option)
        short -= option.part.gpus
    released: list[Option] = []
    alloc = None
    try:
        for option in chain(enough, options):
            _give(index, option.part, option.watts)
            released.append(option)
            if index.type_free[req.gpu_type] >= req.gpus:
                alloc = place(index, req, strategy, avoid)
                if alloc is not None:
                    break
    finally:
        for option in reversed(released):
            _take(index, option.part, option.watts)
    if alloc is None:
        return None
    used = {(n, g) for n, gs in alloc.slots for g in gs}
    chosen = {
        i
        for i, option in enumerate(released)
        if any((n, g) in used for n, gs in option.part.slots for g in gs)
    }
    chosen |= _power_victims(index, req, alloc, released, chosen)
    victims = [
        Victim(v, option.kept)
        for i, option in enumerate(released)
        if i in chosen
        for v in option.jobs
    ]
    return PreemptionPlan(alloc, victims)


def _power_victims(
    index: CapacityIndex,
    req: Request,
    alloc: Allocation,
    released: list[Option],
    chosen: set[int],
) -> set[int]:
    """Victims the gang needs for the power they free, not their GPUs (S10): placement found
    room in a rack's cap only with them released, so sparing them would overdraw the rack.
    Returns the indices in `released` to stop as well, cheapest first, until every rack of
    the gang has the headroom for it."""
    w = index.watts_per_gpu(req.gpu_type, req.power_profile)
    need: dict[int, float] = {}
    for node, gpus in alloc.slots:
        r = index.node_rack[node]
        need[r] = need.get(r, 0.0) + len(gpus) * w
    room = {r: index.power_headroom(r) for r in need}

    def free(i: int) -> None:
        option = released[i]
        for node, gpus in option.part.slots:
            r = index.node_rack[node]
            if r in room:
                room[r] += len(gpus) * option.watts

    for i in chosen:
        free(i)
    extra: set[int] = set()
    for i, option in enumerate(released):
        racks = {index.node_rack[n] for n, _ in option.part.slots}
        if i not in chosen and any(room.get(r, 0.0) < need.get(r, 0.0) for r in racks):
            extra.add(i)
            free(i)
    return extra


def _give(index: CapacityIndex, alloc: Allocation, w: float) -> None:
    for node, gpus in alloc.slots:
        index.give(node, gpus_to_mask(gpus), w)


def _take(index: CapacityIndex, alloc: Allocation, w: float) -> None:
    for node, gpus in alloc.slots:
        index.take(node, gpus_to_mask(gpus), w)
