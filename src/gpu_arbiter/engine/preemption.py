"""Who may be stopped to make room, and which victims to choose (S1, S2, S8).

Rules (Arbiter policy; baselines override `Policy.may_preempt`):
- tier-1 jobs are never preempted or shrunk;
- *reclaim*: a job that runs within its team's quota may preempt jobs of other teams that run on
  borrowed capacity, whatever their tier;
- *priority*: a job may preempt a job of a lower tier (larger number) when it is within its
  quota, or the victim is borrowed, or both belong to the same team — a team beyond its quota
  cannot take another team's guaranteed GPUs just by having a higher tier. Tier 1 is the
  exception (S1): a tier-1 job preempts at tier 1 only within its team's guarantee plus what
  is left of the pool (`Scheduler.admissible`), so the GPUs it needs exist by count and every
  other team's guarantee still fits in the rest; when they lie scattered over nodes (a gang
  that must sit on one node) it may stop lower-tier jobs of any team, and their teams find
  their guarantee on the GPUs it left free, reclaiming from borrowers where need be. Before
  this, tier-1 8-GPU jobs on Gavel's msr traces waited 15 to 157 hours (P99) for a node
  whose one-GPU jobs all ran within other teams' guarantees (6c71a0, 7f04ca, seeds 0-4); now
  1 minute. A tier-1 job that borrows at tier 2 (beyond its guarantee and the pool, S2) is a
  borrower and takes no guaranteed job, but still goes before tier-2 jobs borrowing from
  other teams, as a tier-1 job (not before tier-1 jobs that borrow).
Tier-2 victims get the configured grace and a checkpoint request; tier-3 victims are asked to
save first, within `EngineConfig.notice_stop_s`, except that a tier-1 job stops them at once
(S1) while that throws away at most `EngineConfig.tier1_stop_max_unsaved_s` of work
(`Scheduler._grace`); those that stop at once rank before those that save.

Victims are chosen cheapest first: elastic jobs that can shrink, then tier 3 before tier 2;
among victims given notice, the one expected to end soonest by its walltime estimate (one that
completes within its notice frees its GPUs then and loses nothing; past the grace they all wait
the same); then, for victims given notice (they save, so nothing is lost), the one expected to
run longest (shortest remaining keeps running, as in SRPT; 0e4a51 72.41 -> 71.51 h, Alibaba
7.676 -> 7.664 h, where the least unsaved work picked jobs that had just restarted), and for
victims stopped at once, the least work lost since the last checkpoint; then borrowed before
owned, youngest run.
Lost work comes before borrowed-or-owned: where the preemptor may take either
(`Policy.may_preempt`), taking a borrowed job that has run for days without a checkpoint
instead of an owned one that started a minute ago throws the days away (on 0e4a51 with
borrowed first: mean JCT 106.7 h, 18,664 GPU-h lost; lost first: 101.1 h, 16,986).
Fractional jobs (S11) are victims only all together: a GPU that jobs of one tier alone share is
one option that stops them all, given the notice a whole job of their tier would get. Where
that is a stop at once (tier 3 for a tier-1 job, or an inference surge) it is costed by the
work they lose together, and beyond `EngineConfig.shared_stop_max_unsaved_s` of it they save
first, as a whole job would, for a tier-1 job (an inference surge cannot wait: no option). While
they save, the GPU takes no newcomers (`SharedGpus.close`). A GPU shared with a job of another
tier is freed by nobody.
Candidates are released tentatively in the capacity index until the gang fits; victims whose
GPUs the gang does not use are then spared, and the index is restored — the plan changes
nothing by itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import chain

from gpu_arbiter.domain import Allocation, Job
from gpu_arbiter.engine.capacity import CapacityIndex
from gpu_arbiter.engine.elastic import shrunk_allocation
from gpu_arbiter.engine.placement import Request, gpus_to_mask, place


@dataclass(slots=True)
class Victim:
    job: Job
    shrink_to: Allocation | None  # None: stop the job; else: shrink it to this allocation


@dataclass(slots=True)
class PreemptionPlan:
    allocation: Allocation
    victims: list[Victim]


@dataclass(slots=True, eq=False)
class Option:
    """One way to free GPUs for a preemptor: stop `jobs` (one job, or every fractional job
    sharing one GPU, S11: the GPU is free only once they all stop), or shrink one elastic job
    to `kept`. It is stale once any of the jobs stopped, was resized or changed its borrowed
    flag since it was made (`current`)."""

    key: tuple  # the cost order (`option_key`), cheapest first
    jobs: tuple[Job, ...]
    kept: Allocation | None  # what a shrunk job keeps; None: the jobs stop
    part: Allocation  # the GPUs it frees
    watts: float  # the power booked for each GPU of `part`
    at_once: bool  # it frees the GPUs at once: a shrink, or jobs stopped without notice
    made_with: tuple[tuple[Allocation | None, bool], ...]  # each job's allocation and flag then

    def current(self) -> bool:
        return all(
            v.allocation is alloc and v.borrowed == borrowed
            for v, (alloc, borrowed) in zip(self.jobs, self.made_with, strict=True)
        )


def victim_options(
    jobs: Iterable[Job],
    shrink: bool,
    notice: float,
    now: float,
    watts: Callable[[Job], float],
    by_estimates: bool = True,
    save_over: tuple[float, float] | None = None,
) -> list[Option]:
    """The running jobs in `jobs` as victim options, cheapest first (see the module doc): shrunk
    to their minimum when `shrink` (jobs that cannot shrink are left out), else stopped, each
    expected to keep running for at most `notice` seconds after its notice (0: at once).
    `watts`: a job's power per GPU. Without `by_estimates` (a policy that does not read
    walltime estimates), victims are ranked by tier and work lost alone. `save_over`: jobs
    with much unsaved work save first instead of stopping at once (`notice_given`), and rank
    after those that stop at once."""
    options = []
    for v in jobs:
        alloc = v.allocation
        kept = shrunk_allocation(v) if shrink else None
        if shrink and kept is None:
            continue
        given = notice_given(v, notice, now, save_over)
        wait = notice_wait(v, given, now) if by_estimates else given
        # Given notice, a victim saves and loses nothing: the one expected to run longest goes
        # first (no estimate: as long as can be).
        if given > 0 and by_estimates:
            cost = now - v.expected_end_at
        else:
            cost = v.unsaved_at(now) * alloc.gpus
        key = (-int(v.tier), wait, cost, not v.borrowed, -(v.started_at or 0.0), v.seq)
        part = alloc if kept is None else _difference(alloc, kept)
        made_with = ((alloc, v.borrowed),)
        options.append(Option(key, (v,), kept, part, watts(v), given == 0, made_with))
    options.sort(key=option_key)
    return options


def shared_gpu_option(
    sharers: tuple[Job, ...],
    watts: float,
    notice: float,
    now: float,
    max_unsaved: float,
    save_s: float | None = None,
    by_estimates: bool = True,
) -> Option | None:
    """The fractional jobs sharing one GPU (S11), all of one tier, as one victim option that
    stops them all and frees the GPU (`watts`: the power booked for it), each given `notice`,
    ranked among the tier's victims as a whole job would be (`victim_options`). Stopped at once
    (`notice` 0), they cost the work they lose, each sharer's unsaved time in full (a pod loses
    all of it, whatever its share of the GPU); where that is more than `max_unsaved` seconds
    they save first, in `save_s` (`notice_given`'s rule for whole jobs), and without `save_s`
    the option is None. `by_estimates` as for `victim_options`."""
    lost = shared_unsaved(sharers, now)
    notice = shared_notice(lost, notice, max_unsaved, save_s)
    if notice is None:
        return None
    if by_estimates:
        wait = max(notice_wait(v, notice, now) for v in sharers)
        cost = lost if notice == 0 else now - max(v.expected_end_at for v in sharers)
    else:
        wait, cost = notice, lost
    youngest = max(v.started_at or 0.0 for v in sharers)
    borrowed = all(v.borrowed for v in sharers)
    tier = int(sharers[0].tier)
    key = (-tier, wait, cost, not borrowed, -youngest, min(v.seq for v in sharers))
    made_with = tuple((v.allocation, v.borrowed) for v in sharers)
    return Option(key, sharers, None, sharers[0].allocation, watts, notice == 0, made_with)


def shared_unsaved(sharers: Iterable[Job], now: float) -> float:
    """The work the fractional jobs sharing one GPU would lose together if stopped at `now`."""
    return sum(v.unsaved_at(now) for v in sharers)


def shared_notice(
    lost: float, notice: float, max_unsaved: float, save_s: float | None
) -> float | None:
    """The notice the jobs sharing one GPU get where each would be given `notice`: a stop at
    once that would lose more than `max_unsaved` of their work together (`lost`) becomes
    `save_s` to save first, or, without `save_s`, no stop (None)."""
    if notice == 0 and lost > max_unsaved:
        return save_s
    return notice


def notice_given(
    victim: Job, notice: float, now: float, save_over: tuple[float, float] | None
) -> float:
    """The notice a victim that would be given `notice` gets: where that is 0 (a stop at
    once) and `save_over` = (cap, save_s), `save_s` to save first if the stop would throw away
    more than `cap` of unsaved work (reference seconds x GPUs)."""
    if notice == 0 and save_over is not None:
        if victim.unsaved_at(now) * victim.gpus_held > save_over[0]:
            return save_over[1]
    return notice


def notice_wait(victim: Job, notice: float, now: float) -> float:
    """How long a victim given notice at `now` is expected to keep its GPUs: `notice` seconds
    (the time it takes to save and stop, at most its grace) or, if its walltime estimate says
    so, until it completes before."""
    return min(notice, max(0.0, victim.expected_end_at - now))


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


def option_key(option: Option) -> tuple:
    """The cost order of victim options (cheapest first)."""
    return option.key


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


def _difference(full: Allocation, kept: Allocation) -> Allocation:
    keep = {n: set(gs) for n, gs in kept.slots}
    slots = []
    for n, gs in full.slots:
        rest = tuple(g for g in gs if g not in keep.get(n, ()))
        if rest:
            slots.append((n, rest))
    return Allocation(full.gpu_type, tuple(slots))


def _give(index: CapacityIndex, alloc: Allocation, w: float) -> None:
    for node, gpus in alloc.slots:
        index.give(node, gpus_to_mask(gpus), w)


def _take(index: CapacityIndex, alloc: Allocation, w: float) -> None:
    for node, gpus in alloc.slots:
        index.take(node, gpus_to_mask(gpus), w)
