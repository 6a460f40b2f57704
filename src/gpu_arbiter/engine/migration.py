"""Moving running jobs onto a faster accepted GPU type when one frees up (S7).

A job that started on a slow type because the fast one was taken keeps running there long
after the fast GPUs free up, unless something moves it. This step, run after the pending walk
(so pending jobs always get free GPUs first), looks at the GPUs still free and moves running
jobs onto a faster accepted type when the move is expected to finish them sooner, counting
everything the move costs:

* the work since the job's last checkpoint, which a stop at once throws away;
* the restart overhead (restoring the checkpoint, `EngineConfig.restart_overhead_s`).

By the user's walltime estimate `W` (reference seconds), the share of its work done `d` and
the share its last checkpoint saved `c` (what a job reports as steps done of its total, F4;
the same reading `SchedulerView.est_runtime` uses), and the rates `r` (current) and `r'` (target),
staying takes `W (1 - d) / r` and moving `overhead + W (1 - c) / r'`. A move is made when it saves
at least `MoveRules.min_gain_s` and `MoveRules.min_gain_share` of the time staying would take.
Jobs without a walltime estimate are never moved (nothing to judge the gain by).

Who may move: tier-2 and tier-3 jobs are asked to checkpoint and stop (`SchedulerView.notice_stop`)
within the tier-2 grace or, for tier 3, the minute a save takes (`EngineConfig.notice_stop_s`,
as for a tier-3 victim of a tier-2 job), keep running until they have saved
(`SchedulerView.notice_s`), keep all their progress, and are queued again with the target type as
their first choice (the GPUs are counted as promised, so no other move takes them; a pending
job still may). For them, moving takes `notice + overhead + (what is left after the notice) /
r'`. Where jobs cannot save on notice (`notice_stop_s` = 0), a tier-3 job is stopped at once,
losing its unsaved work, and restarts on the free GPUs in the same cycle. Tier-1 jobs are never
preempted, and a move is a stop and a restart, so they never move. Fractional (S11) and
inference jobs stay where they are. A job that started, or was resized, in this very cycle is
not moved (the walk just chose its type). The move must respect the backfill
reservation of the type it moves to (it must end before the reserved start or fit in the
reservation's spare GPUs), so it never delays a blocked higher-priority job.

A move also makes way (S7: a job may move to a slower type to free the one another job needs
more). When the job holding a type's backfill reservation accepts that type only and no
preemption could start it (S2 lets a team suspend only capacity borrowed from it), running
jobs of its tier or a lower one that accept other types move off the GPUs it needs, onto an
accepted type with room now that pending pinned jobs do not want (the roomiest of equals) and
at least `EngineConfig.slower_type_min_speed` of their speed,
when the wait this saves the pinned job exceeds the time the moves add to the moved jobs
(save, restore, a slower rate), each job's time counted once as in the mean JCT, by the
move's margins (`worth_moving`). The moved jobs are chosen as a preemption plan's victims are
(`preemption.plan.plan_preemption`): the cheapest, and only those whose GPUs the pinned job
is placed on; a move that would free GPUs it cannot use is not made.

`plan_and_move` only reads the scheduler to choose the moves; `SchedulerView.move` carries a
move out as a `Preempt` (grace 0) followed by a `Start` on the new allocation, the decisions
both drivers already apply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpu_arbiter.domain import MILLI, Allocation, Job, JobKind, Tier
from gpu_arbiter.engine.backfill import Reservation, fits_before, may_take
from gpu_arbiter.engine.placement import Request, gpus_to_mask, may_place_after
from gpu_arbiter.engine.preemption.plan import plan_preemption
from gpu_arbiter.engine.preemption.victims import Option

if TYPE_CHECKING:
    from gpu_arbiter.engine.capacity import CapacityIndex
    from gpu_arbiter.engine.policy import SchedulerView


@dataclass(frozen=True, slots=True)
class MoveRules:
    min_gain_s: float = 600.0  # a move must save at least this much wall time ...
    min_gain_share: float = 0.2  # ... and this share of the time staying would take
    max_moves: int = 16  # moves per cycle
    tiers: tuple[int, ...] = ()  # tiers that may be stopped at once
    # Tiers asked to save and stop first: tier 2 within its grace, tier 3 within a save's time.
    noticed_tiers: tuple[int, ...] = (int(Tier.BUSINESS), int(Tier.EXPLORATORY))


@dataclass(frozen=True, slots=True)
class Move:
    job: Job
    gpu_type: str
    stay_s: float  # expected wall time to finish where it is
    move_s: float  # expected wall time to finish after the move, overhead included
    grace_s: float = 0.0  # notice before the stop (tier 2); 0: stopped and restarted at once

    @property
    def gain_s(self) -> float:
        return self.stay_s - self.move_s


def finish_times(
    walltime_ref: float,
    done: float,
    saved: float,
    rate_now: float,
    rate_new: float,
    overhead_s: float,
    notice_s: float | None = None,
    duration_ref: float = math.inf,
) -> tuple[float, float]:
    """(stay, move): expected wall seconds to finish on the current allocation and after a
    restart at `rate_new` from the saved share of the work, by the walltime estimate. A job
    given notice (`notice_s` not None) runs on where it is for `notice_s` first (at `rate_now`,
    its work being `duration_ref`), until it has saved, and keeps all its progress."""
    stay = walltime_ref * max(0.0, 1 - done) / rate_now if rate_now > 0 else math.inf
    if notice_s is not None:
        left = max(0.0, 1 - done - rate_now * notice_s / duration_ref)
        return stay, notice_s + overhead_s + walltime_ref * left / rate_new
    move = overhead_s + walltime_ref * max(0.0, 1 - saved) / rate_new
    return stay, move


def worth_moving(stay_s: float, move_s: float, rules: MoveRules) -> bool:
    gain = stay_s - move_s
    return gain >= rules.min_gain_s and gain >= rules.min_gain_share * stay_s


def never_worth(
    walltime_ref: float,
    done: float,
    rate_now: float,
    rate_new: float,
    overhead_s: float,
    notice_s: float | None,
    duration_ref: float,
    rules: MoveRules,
) -> bool:
    """Whether no later moment of this run (same rates) can make the move worth it, so the
    pair need not be weighed again until the job restarts or changes rate.

    In what is left of the work by the estimate, `y = W (1 - d)`, which only shrinks while the
    job runs, staying takes `y / r` and moving at least `fixed + max(0, y - k) / r'` (the
    notice and the restart, then what the notice did not do, `k = W r notice / D`; without
    notice `k = 0` and the saved share is at most the done share). The gain grows with what
    is left, so it reaches `min_gain_s` only down to some `x_g`; and the margin over
    `min_gain_share` (`(1 - share) x / r - move`) is concave and piecewise linear in `x`, so
    its largest value over `[x_g, y]`, where both rules must hold at once, is at an end or
    at `k`. Only for a faster target: elsewhere nothing is monotone."""
    if rate_new <= rate_now or rate_now <= 0:
        return False
    y = walltime_ref * max(0.0, 1 - done)
    if notice_s is None:
        fixed, k = overhead_s, 0.0
    else:
        fixed, k = notice_s + overhead_s, walltime_ref * rate_now * notice_s / duration_ref

    def move(x: float) -> float:
        return fixed + max(0.0, x - k) / rate_new

    least = rules.min_gain_s
    if y / rate_now - move(y) < least:
        return True
    # Where the gain falls to `min_gain_s`: below `k` it is `x / r - fixed`, above it
    # `x (1/r - 1/r') + k / r' - fixed`.
    if k / rate_now - fixed >= least:
        x_g = rate_now * (least + fixed)
    else:
        x_g = (least + fixed - k / rate_new) / (1 / rate_now - 1 / rate_new)
    x_g = min(max(x_g, 0.0), y)
    keep = 1 - rules.min_gain_share
    ends = (y, x_g, k) if x_g <= k <= y else (y, x_g)
    return max(keep * x / rate_now - move(x) for x in ends) < 0


def movable(sched: SchedulerView, job: Job, now: float, rules: MoveRules) -> bool:
    return (
        int(job.tier) in rules.tiers + rules.noticed_tiers
        and job.tier != Tier.CORE
        and job.spec.walltime_s is not None
        and job.spec.kind == JobKind.TRAINING
        and job.spec.gpu_milli == MILLI
        and not job.preempting
        and job.id not in sched.pending_stops
        and job.id not in sched.hold_of
        and job.segment_start != now  # started or resized in this very cycle
    )


def _graces(sched: SchedulerView, rules: MoveRules) -> dict[int, float]:
    """The notice each tier that may move gets (0: stopped and restarted at once)."""
    grace = {k: sched.notice_of_tier(k) for k in rules.noticed_tiers}  # the others: at once
    grace.update({k: 0.0 for k in rules.tiers if k not in grace})
    grace.pop(int(Tier.CORE), None)  # never: a move is a preemption
    return grace


@dataclass(frozen=True, slots=True)
class _Outlook:
    """A running job as a move of it is weighed: its notice (0: stopped at once) and how long
    it runs on after it (until it has saved), its rate now, and the shares of its work done
    and saved, read once for every type it might go to."""

    job: Job
    notice: float
    runs_on: float | None
    rate: float
    done: float
    saved: float

    @classmethod
    def of(cls, sched: SchedulerView, job: Job, notice: float, now: float) -> _Outlook:
        job.advance(now)
        runs_on = sched.notice_s(notice) if notice > 0 else None
        d = job.spec.duration_s
        return cls(job, notice, runs_on, job.rate, job.progress_s / d, job.saved_progress(now) / d)

    def rate_on(self, sched: SchedulerView, gpu_type: str) -> float:
        """Its rate on `gpu_type`, on the GPUs it holds now."""
        return sched.speed(self.job, gpu_type) * self.job.gpus_held / self.job.spec.gpus

    def times(self, rate_new: float, overhead: float) -> tuple[float, float]:
        """(staying, moving): when it would finish either way (`finish_times`)."""
        spec = self.job.spec
        return finish_times(
            spec.walltime_s,
            self.done,
            self.saved,
            self.rate,
            rate_new,
            overhead,
            self.runs_on,
            spec.duration_s,
        )

    def never_worth(self, rate_new: float, overhead: float, rules: MoveRules) -> bool:
        """Whether no later moment of this run can make the move worth it (`never_worth`)."""
        spec = self.job.spec
        return never_worth(
            spec.walltime_s,
            self.done,
            self.rate,
            rate_new,
            overhead,
            self.runs_on,
            spec.duration_s,
            rules,
        )


def candidate_moves(
    sched: SchedulerView, now: float, rules: MoveRules, free: dict[str, int]
) -> list[Move]:
    """Every worthwhile move of a running job onto a type with enough `free` GPUs now (before
    placement, which may still fail on topology or power). A target `never_worth` rules out
    for the job's current run is struck from the scheduler's move index
    (`SchedulerView.rule_out_move`), so a busy cluster does not weigh the same hopeless moves
    every cycle."""
    overhead = sched.cfg.restart_overhead_s
    grace = _graces(sched, rules)
    index = sched.slower_than
    seen: set[str] = set()
    moves: list[Move] = []
    ruled_out: list[tuple[Job, str]] = []
    # Only jobs that would run faster on a type with free GPUs can move at all.
    for target, room in free.items():
        if room <= 0:
            continue
        for job in index[target].values():
            # One with more GPUs than the target has free is looked at under another target
            # where they are free, if any (the move goes to whichever faster type has room).
            if job.allocation.gpus > room or job.id in seen or int(job.tier) not in grace:
                continue
            seen.add(job.id)
            n = job.gpus_held
            faster = [t for t in sched.faster_types(job) if free[t] >= n and job.id in index[t]]
            if not faster or not movable(sched, job, now, rules):
                continue
            look = _Outlook.of(sched, job, grace[int(job.tier)], now)
            best: Move | None = None
            for t in faster:
                rate_new = look.rate_on(sched, t)
                stay, move = look.times(rate_new, overhead)
                if worth_moving(stay, move, rules):
                    if best is None or move < best.move_s:
                        best = Move(job, t, stay, move, look.notice)
                elif look.never_worth(rate_new, overhead, rules):
                    ruled_out.append((job, t))
            if best is not None:
                moves.append(best)
    for job, t in ruled_out:
        sched.rule_out_move(job, t)
    return moves


def plan_and_move(
    sched: SchedulerView,
    now: float,
    reservations: dict[str, Reservation],
    rules: MoveRules | None = None,
    promised: dict[str, tuple[str, int]] | None = None,
    placement: str = "pack",
) -> int:
    """Carry out the worthwhile moves, most GPU time saved first, then the moves that make way
    for pinned jobs (`make_way`, placing them by `placement`); returns how many were made.

    `promised` (job id -> (GPU type, GPUs)) books the GPUs of tier-2 moves waiting out their
    grace; entries of jobs no longer stopping are dropped, new ones added."""
    rules = rules or MoveRules()
    promised = {} if promised is None else promised
    for job_id in [j for j in promised if j not in sched.pending_stops]:
        del promised[job_id]
    free = dict(sched.index.type_free)
    for t, n in promised.values():
        free[t] -= n
    moves = sorted(
        candidate_moves(sched, now, rules, free),
        key=lambda m: (-m.gain_s * m.job.gpus_held, m.job.seq),
    )
    made = 0
    for m in moves:
        if made >= rules.max_moves:
            break
        job, t, n = m.job, m.gpu_type, m.job.gpus_held
        if free[t] < n or job.allocation is None:
            continue  # an earlier move took the GPUs
        res = reservations.get(t)
        off_limits = res is not None and not may_take(res, job.id, n, m.move_s, now)
        if off_limits and res.node is None:
            continue
        alloc: Allocation | None = sched.find_for(job, t, n, res, off_limits)
        if alloc is None:
            continue
        why = (
            f"moving from {job.allocation.gpu_type} to {t}: expected to finish "
            f"{m.gain_s / 60:.0f} min sooner"
        )
        _carry_out(sched, m, alloc, res, now, promised, why)
        free[t] -= n
        made += 1
    return made + make_way(
        sched, now, reservations, rules, free, promised, rules.max_moves - made, placement
    )


def _carry_out(
    sched: SchedulerView,
    m: Move,
    alloc: Allocation,
    res: Reservation | None,
    now: float,
    promised: dict[str, tuple[str, int]],
    why: str,
    for_job: str | None = None,
) -> None:
    """Stop the job at once and restart it on `alloc`, or give it notice with the target's
    GPUs promised; either way booked against the target type's reservation `res`."""
    job, n = m.job, m.job.gpus_held
    if res is not None and res.job_id != job.id and res.covers(alloc):  # off limits: never
        fits_before(res, n, m.move_s, now)  # books the extra GPUs the move takes
    if m.grace_s > 0:
        sched.notice_stop(job, m.grace_s, why, for_job)
        promised[job.id] = (m.gpu_type, n)
    else:
        sched.move(job, alloc, now, why)


def make_way(
    sched: SchedulerView,
    now: float,
    reservations: dict[str, Reservation],
    rules: MoveRules,
    free: dict[str, int],
    promised: dict[str, tuple[str, int]],
    budget: int,
    placement: str = "pack",
) -> int:
    """Move flexible jobs off the GPUs a blocked pinned job needs (see the module doc): for
    each type whose reservation a job accepting that type only holds. Returns how many moved;
    `free` loses the GPUs they take."""
    made = 0
    for res in list(reservations.values()):
        holder = sched.jobs.get(res.job_id)
        if (
            holder is None
            or holder.id not in sched.queue
            or len(sched.types_by_speed(holder)) != 1
            or res.shadow_time - now < rules.min_gain_s  # GPUs free soon enough anyway
        ):
            continue
        way = way_for(sched, holder, res, now, rules, free, reservations, placement)
        if way is None or len(way) > budget - made:
            continue
        for m, alloc, target_res in way:
            t, n = m.gpu_type, m.job.gpus_held
            if m.grace_s == 0:  # the job restarts now: where, after the moves before it
                off_limits = target_res is not None and not may_take(
                    target_res, m.job.id, n, m.move_s, now
                )
                alloc = sched.find_for(m.job, t, n, target_res, off_limits)
                if alloc is None:
                    continue
            why = (
                f"moving from {res.gpu_type} to {t} to make way for job {holder.id}, which"
                f" runs on {res.gpu_type} only: expected to finish {-m.gain_s / 60:.0f} min"
                " later, the other job to start much sooner"
            )
            _carry_out(sched, m, alloc, target_res, now, promised, why, holder.id)
            free[t] -= n
            made += 1
    return made


def way_for(
    sched: SchedulerView,
    holder: Job,
    res: Reservation,
    now: float,
    rules: MoveRules,
    free: dict[str, int],
    reservations: dict[str, Reservation],
    placement: str = "pack",
    *,
    shortcuts: bool = True,
) -> list[tuple[Move, Allocation, Reservation | None]] | None:
    """The moves (each with the allocation it would get now and its target's reservation)
    that let `holder` be placed on `res`'s type, or None when no such moves are worth it: the
    cheapest movers first, jobs already stopping there counted as freeing their GPUs, and
    only those whose GPUs the holder's placement uses (`plan_preemption`).

    Most looks find no way: even all the jobs that could make way cannot free room for the
    gang. Two tests end those looks early, with the same answer and the same capacity index
    as the full search (`shortcuts=False`, for tests that compare the two)."""
    t, index = res.gpu_type, sched.index
    # No job may move to a type with fewer free GPUs than it holds (`_way_off`'s room rule).
    room = max((n for u, n in free.items() if u != t), default=0)
    if room <= 0:
        return None
    grace = _graces(sched, rules)
    stopping: list[Job] = []  # free their GPUs anyway
    others: list[Job] = []  # may make way where another type has room for them
    for job in sched.running_by_type[t].values():
        alloc = job.allocation
        if res.node is not None and res.node not in alloc.nodes:
            continue
        if job.spec.gpu_milli != MILLI:
            continue  # a shared GPU frees only when every sharer stops
        if job.preempting or job.id in sched.pending_stops:
            stopping.append(job)
        elif alloc.gpus <= room and _may_make_way(sched, job, holder, now, rules, grace):
            others.append(job)
    # The plan below frees GPUs only by stopping some of these jobs: where even all of them
    # are too few by count, it would fail before touching anything, so none is weighed.
    short = res.gpus - index.type_free[t]
    if shortcuts and sum(job.allocation.gpus for job in (*stopping, *others)) < short:
        return None
    # Free GPUs of each other type beyond what pending jobs pinned to it want, by tier.
    left = {
        (u, k): n - sched.queue.pinned_at_or_above(u, k)
        for u, n in free.items()
        if u != t
        for k in grace
    }
    movers: list[tuple[Job, list[str]]] = []  # may make way, with the types they may go to
    for job in others:
        targets = _way_off(sched, job, t, left)
        if targets:
            movers.append((job, targets))
    if not movers:
        return None
    jobs = [*stopping, *(job for job, _ in movers)]
    if shortcuts and sum(job.allocation.gpus for job in jobs) < short:
        return None
    s = holder.spec
    req = Request(t, res.gpus, s.tp_size, s.max_racks, s.power_profile, s.data_locality)
    # Where even all of them could not hold the gang by the placement rules, none of the
    # plan's placements is tried, and no move is weighed where the order the plan would
    # release them in leaves no trace.
    if shortcuts and not may_place_after(index, req, (job.allocation for job in jobs)):
        parts = _unranked(index, t, jobs)
        if parts is None:
            ordered, _ = _by_cost(sched, t, stopping, movers, grace, now)
            parts = [(o.watts, _masks(o.part)) for o in ordered]
        _as_a_failed_plan_leaves(index, parts)
        return None
    ordered, moves = _by_cost(sched, t, stopping, movers, grace, now)
    plan = plan_preemption(index, req, ordered, placement)
    if plan is None:
        return None
    chosen = [moves[v.job.id] for v in plan.victims if v.job.id in moves]
    if not chosen:
        return None  # the jobs already stopping free enough
    starts_in = max(sched.notice_s(m.grace_s) if m.grace_s > 0 else 0.0 for m in chosen)
    added = sum(-m.gain_s for m in chosen)
    if not worth_moving(res.shadow_time - now - starts_in, added, rules):
        return None
    taken: dict[str, int] = {}
    way = []
    for m in chosen:
        u, n = m.gpu_type, m.job.gpus_held
        taken[u] = taken.get(u, 0) + n
        if taken[u] > free[u]:
            return None
        target_res = reservations.get(u)
        off_limits = target_res is not None and not may_take(target_res, m.job.id, n, m.move_s, now)
        if off_limits and target_res.node is None:
            return None
        alloc = sched.find_for(m.job, u, n, target_res, off_limits)
        if alloc is None:
            return None
        way.append((m, alloc, target_res))
    return way


def _by_cost(
    sched: SchedulerView,
    gpu_type: str,
    stopping: list[Job],
    movers: list[tuple[Job, list[str]]],
    grace: dict[int, float],
    now: float,
) -> tuple[list[Option], dict[str, Move]]:
    """The plan's victims, cheapest first (those stopping anyway, then the movers by the
    time their move adds), and each mover's quickest move."""
    options: list[tuple[float, int, Option]] = []
    moves: dict[str, Move] = {}
    for job in stopping:
        options.append((-math.inf, job.seq, _option(sched.index, gpu_type, job)))
    for job, targets in movers:
        m = _quickest(sched, job, targets, grace[int(job.tier)], now)
        moves[job.id] = m
        options.append((-m.gain_s, job.seq, _option(sched.index, gpu_type, job)))
    options.sort(key=lambda o: o[:2])
    return [o for _, _, o in options], moves


Parts = list[tuple[float, list[tuple[int, int]]]]  # per victim: its watts per GPU, its masks


def _masks(alloc: Allocation) -> list[tuple[int, int]]:
    return [(node, gpus_to_mask(gpus)) for node, gpus in alloc.slots]


def _unranked(index: CapacityIndex, gpu_type: str, jobs: list[Job]) -> Parts | None:
    """Releases and retakes that leave the capacity index as releasing and retaking all the
    jobs' GPUs in any order would, or None where the order matters.

    A node with free GPUs that is released and retaken goes to the end of its free-count
    buckets; with at most one such node per free count among theirs, one release and retake
    on each leaves every bucket in the same order. Every rack's power stays where it was
    when it and each victim's watts are whole numbers (far below 2**53: their sums are exact
    in any order); otherwise the float sums depend on the order."""
    at: dict[int, int] = {}  # free count -> the node with free GPUs there
    parts: dict[int, tuple[float, list[tuple[int, int]]]] = {}  # node -> one of its slots
    for job in jobs:
        w = index.watts_per_gpu(gpu_type, job.spec.power_profile)
        for node, gpus in job.allocation.slots:
            if not (w * len(gpus)).is_integer():
                return None
            if not index.rack_power[index.node_rack[node]].is_integer():
                return None
            k = index.free[node]
            if not k:
                continue  # in no bucket
            if at.setdefault(k, node) != node:
                return None
            if node not in parts:
                parts[node] = (w, [(node, gpus_to_mask(gpus))])
    return list(parts.values())


def _as_a_failed_plan_leaves(index: CapacityIndex, parts: Parts) -> None:
    """Leave the capacity index as `plan_preemption` leaves it when it releases every victim
    in turn (cheapest first) without placing the gang: the same releases and retakes (each
    victim's GPU masks, `parts`), in the same order, without its placements in between. The
    free GPUs end as they were, but each node released and retaken goes to the end of its
    free-count buckets, an order later placements read; kept so the shortcut changes no
    decision."""
    for w, slots in parts:
        for node, mask in slots:
            index.give(node, mask, w)
    for w, slots in reversed(parts):
        for node, mask in slots:
            index.take(node, mask, w)


def _option(index: CapacityIndex, gpu_type: str, job: Job) -> Option:
    """Stopping `job` as a victim of the plan that places the pinned job."""
    w = index.watts_per_gpu(gpu_type, job.spec.power_profile)
    return Option((), (job,), None, job.allocation, w, True, ((job.allocation, job.borrowed),))


def _may_make_way(
    sched: SchedulerView,
    job: Job,
    holder: Job,
    now: float,
    rules: MoveRules,
    grace: dict[int, float],
) -> bool:
    """Whether a running job may make way for `holder` at all: not tier 1 (`grace` has no
    notice for it), not a tier above the holder's, and `movable`."""
    tier = int(job.tier)
    return tier >= int(holder.tier) and tier in grace and movable(sched, job, now, rules)


def _way_off(
    sched: SchedulerView, job: Job, gpu_type: str, left: dict[tuple[str, int], int]
) -> list[str]:
    """The types a job that may make way can move to off `gpu_type`, roomiest first: other
    accepted types with room now beyond what pending jobs pinned to them want (`left`, by
    type and tier: as the walk's S7 rule) and at least `slower_type_min_speed` of its speed
    here."""
    n, tier = job.gpus_held, int(job.tier)
    spare = {  # what the type has left after the job and the pinned jobs
        u: room - n
        for u in sched.types_by_speed(job)
        if u != gpu_type and (room := left[(u, tier)]) >= n
    }
    if not spare:
        return []
    floor = sched.cfg.slower_type_min_speed * sched.speed(job, gpu_type)
    targets = [u for u in spare if sched.speed(job, u) >= floor]
    if len(targets) > 1:
        targets.sort(key=spare.__getitem__, reverse=True)
    return targets


def _quickest(
    sched: SchedulerView, job: Job, targets: list[str], notice: float, now: float
) -> Move:
    """The quickest move of a running job to one of `targets` (`_way_off`); its `gain_s` may
    be negative: the time it adds."""
    look = _Outlook.of(sched, job, notice, now)
    best: Move | None = None
    for u in targets:
        stay, move = look.times(look.rate_on(sched, u), sched.cfg.restart_overhead_s)
        if best is None or move < best.move_s:  # the roomiest of equals (`targets`' order)
            best = Move(job, u, stay, move, look.notice)
    return best
