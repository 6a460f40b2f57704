"""The engine's running state and its only mutators.

`EngineState` holds what runs where (the running indexes by type, tier, team, expected end and
node, the elastic and borrowed sets, the jobs that could run faster elsewhere), the GPUs held
for preemptors (`Hold`), the stops under notice, and the counters of change the memos read
(`engine.memo`). Its methods are the only code that changes any of these: start, release,
stop, resize, hold (and its end), adopt, move_gpus, re-tiering, notices and stops, nodes out
of and back in service. Each keeps the capacity index, the running indexes, the quota and
fair-share books and the borrowed flags in step. The scheduler (`engine.scheduler`) and its
steps read the indexes and call these methods; the decisions the changes make (Start, Resize,
Preempt) are collected here until the cycle hands them to the driver."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sortedcontainers import SortedList

from gpu_arbiter.domain import (
    MILLI,
    Allocation,
    Cluster,
    Decision,
    InvalidInput,
    Job,
    JobState,
    Preempt,
    Resize,
    Start,
    Tier,
)
from gpu_arbiter.engine.admission import BudgetRule, QuotaBook, budget_capped
from gpu_arbiter.engine.borrowing import Borrowing
from gpu_arbiter.engine.capacity import CapacityIndex
from gpu_arbiter.engine.config import EngineConfig
from gpu_arbiter.engine.fairshare import FairShare
from gpu_arbiter.engine.fit import TypeFit
from gpu_arbiter.engine.memo import RUN_BANDS, TIERS, PendingNotes, run_band
from gpu_arbiter.engine.ordering import PendingQueue
from gpu_arbiter.engine.placement import gpus_to_mask
from gpu_arbiter.engine.policy import Policy
from gpu_arbiter.engine.sharing import SharedGpus, shared_gpu
from gpu_arbiter.engine.spares import HotSpares


def types_sharing_racks(cluster: Cluster) -> dict[str, set[str]]:
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


@dataclass(slots=True)
class Hold:
    """GPUs kept for a job while the tier-2 victims it preempted use up their grace."""

    job: Job
    allocation: Allocation
    waiting: set[str]
    held: list[tuple[int, int]] = field(default_factory=list)  # (node, mask) taken for it


class EngineState:
    """What runs where, what is held and what is stopping, and the only code that changes it.

    Collaborators it keeps in step: the capacity index with its hot spares and shared GPUs,
    the quota and fair-share books, the pending queue, `notes` (what the walk noted about each
    pending job, ended by a start or a hold) and `victim_changed` (keeps the victim lists of
    a cycle in progress current, `engine.preemption.victims`)."""

    def __init__(
        self,
        cluster: Cluster,
        policy: Policy,
        cfg: EngineConfig,
        budget: BudgetRule | None,
        index: CapacityIndex,
        spares: HotSpares,
        shared: SharedGpus,
        quota: QuotaBook,
        fair: FairShare,
        queue: PendingQueue,
        fit: TypeFit,
        notes: PendingNotes,
        victim_changed: Callable[[Job], None],
    ) -> None:
        self.cluster, self.policy, self.cfg, self.budget = cluster, policy, cfg, budget
        self.index, self.spares, self.shared = index, spares, shared
        self.quota, self.fair, self.queue, self.fit = quota, fair, queue, fit
        self.notes, self.victim_changed = notes, victim_changed
        capacity = cluster.gpus_by_type()
        self.running: dict[str, Job] = {}
        self.running_by_type: dict[str, dict[str, Job]] = {t: {} for t in capacity}
        self.running_by_tier: dict[tuple[str, int], dict[str, Job]] = {
            (t, k): {} for t in capacity for k in TIERS
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
        self.drained: set[int] = set()  # nodes out of placement whose jobs run on (`take_out`)
        self.holds: dict[str, Hold] = {}
        self.hold_of: dict[str, str] = {}  # victim id -> id of the job holding GPUs for it
        self.pending_stops: dict[str, Preempt] = {}
        # What the next cycle reads of what happened since the last one: the decisions made,
        # the jobs queued (again), whether capacity was freed (then it walks every pending
        # job) and when a job that may be a victim last started.
        self.decisions: list[Decision] = []
        self.fresh: list[Job] = []
        self.dirty = True
        self.started_at: float | None = None
        # Counters of change for the memos (`engine.memo`); they only grow. Per type: every
        # change of its running set or free GPUs, GPUs freed, borrowed flags changed; per
        # type and tier: starts by the run their estimate gives them (`run_band`).
        self.epoch: dict[str, int] = {t: 0 for t in capacity}
        self.freed: dict[str, int] = {t: 0 for t in capacity}
        # Both summed over the type and the types sharing its racks' power caps (what the
        # memos' stamps read for every pending job), bumped with them in `changed`.
        self.power_coupled = types_sharing_racks(cluster)
        self.near_epoch: dict[str, int] = {t: 0 for t in capacity}
        self.near_freed: dict[str, int] = {t: 0 for t in capacity}
        self.flips: dict[str, int] = {t: 0 for t in capacity}
        self.reranks: dict[str, int] = {t: 0 for t in capacity}  # `reranked` calls
        self.starts: dict[tuple[str, int], list[int]] = {
            (t, k): [0] * RUN_BANDS for t in capacity for k in TIERS
        }
        self.starts_now: dict[str, tuple[float, int]] = {}  # starts at the latest start time

    def watts(self, job: Job, gpu_type: str | None = None) -> float:
        """The power booked for each GPU of the job (on its type, or on `gpu_type`)."""
        t = gpu_type or job.allocation.gpu_type
        return self.index.watts_per_gpu(t, job.spec.power_profile)

    def running_job(self, job_id: str) -> Job:
        job = self.running.get(job_id)
        if job is None:
            raise InvalidInput(f"job {job_id!r} is not running")
        return job

    def changed(self, gpu_type: str, freed: bool) -> None:
        """Note a change of the type's running set or free GPUs, for the caches that depend on
        them (shadow times, dry runs) and, when GPUs were freed, for the failure memos."""
        self.epoch[gpu_type] += 1
        if freed:
            self.freed[gpu_type] += 1
        # The sums over types sharing racks' power caps (`near_epoch`, `near_freed`): sharing
        # a rack is symmetric, so the types whose sums count this one are those it shares with.
        # The counters only grow, so a sum changes with any of them.
        for t in self.power_coupled[gpu_type]:
            self.near_epoch[t] += 1
            if freed:
                self.near_freed[t] += 1

    def take_decisions(self) -> list[Decision]:
        """The decisions made since the last call (the cycle hands them to the driver)."""
        decisions, self.decisions = self.decisions, []
        return decisions

    def take_fresh(self) -> list[Job]:
        """The jobs queued (again) since the last call (a newcomers-only cycle walks them)."""
        fresh, self.fresh = self.fresh, []
        return fresh

    def enqueue(self, job: Job) -> None:
        """Queue a job (new, or again): the next cycle looks at it even if nothing was freed."""
        self.queue.add(job)
        self.fresh.append(job)

    def start(self, job: Job, alloc: Allocation, now: float, decide: bool = True) -> None:
        """Run the job on `alloc` from `now`; `decide`: record the Start decision (an adopted
        job already runs)."""
        t = alloc.gpu_type
        w = self.watts(job, t)
        milli = job.spec.gpu_milli
        for node, gpus in alloc.slots:
            if milli < MILLI:
                self.shared.take(node, gpus[0], milli, w)
            else:
                self.index.take(node, gpus_to_mask(gpus), w)
            self.node_jobs[node].add(job.id)
        self.changed(t, freed=False)
        if self.policy.preemption and job.tier != Tier.CORE:
            self.started_at = now  # tier 1 is never a victim (S1)
        job.allocation = alloc
        job.state = JobState.RUNNING
        job.speed = self.fit.speed(job, t)
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
        for faster in self.fit.faster_types(job):
            self.slower_than[faster][job.id] = job
        changed = self._borrowing(job.team, t).add(job)
        if job.spec.is_elastic and self.policy.elastic:
            self.elastic_running[job.id] = job
        self.queue.remove(job)
        self.notes.forget(job.id)
        self._rebalance(job.team, t, changed)
        if decide:
            self.decisions.append(Start(job.id, alloc, job.borrowed))

    def _count_start(self, gpu_type: str, tier: int, run: float, now: float) -> None:
        """A job of the tier started on the type, expected to run `run` seconds."""
        counts = self.starts[(gpu_type, tier)]
        for b in range(run_band(run) + 1):
            counts[b] += 1
        at, k = self.starts_now.get(gpu_type, (None, 0))
        self.starts_now[gpu_type] = (now, k + 1 if at == now else 1)

    def adopt(self, job: Job, allocation: Allocation, started_at: float) -> None:
        """Mark a queued job running on exactly `allocation` without a Start decision: a live
        driver that restarts (or rebuilds its engine) finds jobs already running on known GPUs.
        Refuses GPUs that are unknown, down or already taken."""
        if job.state != JobState.PENDING:
            raise InvalidInput(f"job {job.id!r} is {job.state.value}, not pending")
        for node, gpus in allocation.slots:
            if not 0 <= node < len(self.cluster.nodes) or self.index.down[node]:
                raise InvalidInput(f"job {job.id!r}: node {node} is unknown or down")
            mask = gpus_to_mask(gpus)
            if self.index.free_mask[node] & mask != mask:
                raise InvalidInput(f"job {job.id!r}: GPUs {gpus} of node {node} are not free")
            if allocation.gpu_type != self.cluster.nodes[node].gpu_type:
                raise InvalidInput(f"job {job.id!r}: node {node} has no {allocation.gpu_type}")
        self.start(job, allocation, started_at, decide=False)

    def move_gpus(self, job_id: str, allocation: Allocation) -> bool:
        """Record that a running job holds other GPU indices on the same nodes, in the same
        counts, than the engine chose: an executor such as Slurm picks the indices itself.
        Returns False, changing nothing, when the new GPUs are not free in the engine's books
        (or the nodes or counts differ), so the books never double-book a GPU."""
        job = self.running.get(job_id)
        old = job.allocation if job is not None else None
        if job is None or old is None or job.spec.gpu_milli < MILLI:
            return False
        counts = {n: len(g) for n, g in allocation.slots}
        if old.gpu_type != allocation.gpu_type or {n: len(g) for n, g in old.slots} != counts:
            return False
        if any(self.index.down[n] for n in counts):
            return False
        w = self.watts(job)
        for node, gpus in old.slots:
            self.index.give(node, gpus_to_mask(gpus), w)
        new = [(node, gpus_to_mask(gpus)) for node, gpus in allocation.slots]
        fits = all(self.index.free_mask[node] & mask == mask for node, mask in new)
        for node, mask in new if fits else [(n, gpus_to_mask(g)) for n, g in old.slots]:
            self.index.take(node, mask, w)
        if fits:
            job.allocation = allocation
            self.changed(allocation.gpu_type, freed=True)  # for the engine's search caches
        return fits

    def release(self, job: Job) -> None:
        """Take a running job off its GPUs and out of every running index (it finished, was
        cancelled, or is being stopped)."""
        self.dirty = True
        for faster in self.fit.faster_types(job):
            self.slower_than[faster].pop(job.id, None)
        alloc = job.allocation
        t = alloc.gpu_type
        self.changed(t, freed=True)
        w = self.watts(job)
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
                self.flips[gpu_type] += 1
                self.victim_changed(job)
            if job.borrowed:
                borrowed[job.id] = job
            else:
                borrowed.pop(job.id, None)
        self.quota.tier1_excess[(team, gpu_type)] = book.tier1_excess

    def stop(self, job: Job, now: float, keep_all: bool, demote: bool = False) -> None:
        """Stop a running job and queue it again with the progress its checkpoint kept."""
        job.advance(now)
        job.close_segment(job.progress_s if keep_all else job.saved_progress(now))
        self.release(job)
        job.state = JobState.PENDING
        job.queued_since = now
        if job.borrows_at_tier2:  # queued at its own tier again (`_borrows_at_tier2`)
            job.tier, job.borrows_at_tier2 = Tier.CORE, False
        if demote:
            job.tier = Tier(job.tier + 1)
            job.failure_demoted = True
        job.tier = budget_capped(job.team, job.tier, self.budget)
        self.enqueue(job)

    def resize(self, job: Job, alloc: Allocation, now: float, reason: str) -> None:
        """Grow or shrink an elastic running job to `alloc` (a Resize decision)."""
        old = job.allocation
        self.dirty = self.dirty or alloc.gpus < old.gpus
        w = self.watts(job)
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
        self.changed(t, freed=True)
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
        for faster in self.fit.faster_types(job):  # a move may gain at the new rate
            self.slower_than[faster][job.id] = job
        self._rebalance(job.team, t, changed)
        self.victim_changed(job)
        self.decisions.append(Resize(job.id, alloc, reason))

    def hold(self, job: Job, alloc: Allocation, waiting: set[str]) -> None:
        """Keep `alloc` for the job while the victims in `waiting` use up their notice: it takes
        the part that is free now, and the rest as each victim stops (`victim_gone`)."""
        hold = Hold(job, alloc, waiting)
        self.holds[job.id] = hold
        self.queue.remove(job)
        self.notes.blocked.pop(job.id, None)
        self._take_free_part(hold)

    def _take_free_part(self, hold: Hold) -> None:
        self.changed(hold.allocation.gpu_type, freed=False)
        w = self.watts(hold.job, hold.allocation.gpu_type)
        for node, gpus in hold.allocation.slots:
            mask = gpus_to_mask(gpus) & self.index.free_mask[node]
            if mask:
                self.index.take(node, mask, w)
                hold.held.append((node, mask))

    def victim_gone(self, victim_id: str, now: float) -> None:
        """A running job stopped or ended: if a hold waited for it, the hold takes its GPUs,
        and the held job starts once its last victim is gone."""
        holder = self.hold_of.pop(victim_id, None)
        if holder is None or holder not in self.holds:
            return
        hold = self.holds[holder]
        hold.waiting.discard(victim_id)
        self._take_free_part(hold)
        if not hold.waiting:
            self._give_back(hold)
            del self.holds[holder]
            self.start(hold.job, hold.allocation, now)

    def cancel_hold(self, hold: Hold) -> None:
        """Give up a hold (its node failed or drained, or its job was cancelled): the GPUs it
        took are free again and the job is queued."""
        self._give_back(hold)
        del self.holds[hold.job.id]
        for victim_id in hold.waiting:
            self.hold_of.pop(victim_id, None)
        self.enqueue(hold.job)
        self.dirty = True

    def _give_back(self, hold: Hold) -> None:
        self.dirty = True
        self.changed(hold.allocation.gpu_type, freed=True)
        w = self.watts(hold.job, hold.allocation.gpu_type)
        for node, mask in hold.held:
            self.index.give(node, mask, w)
        hold.held.clear()

    def reranked(self, gpu_type: str) -> None:
        """A running job on the type became a victim by a policy's order changing with time
        (`Scheduler.reranked`): failed preemption searches and set-aside waits look again."""
        self.flips[gpu_type] += 1
        self.reranks[gpu_type] += 1
        self.changed(gpu_type, freed=False)
        self.dirty = True

    def retier(self, job: Job, tier: Tier, now: float) -> None:
        """The running job keeps its GPUs at `tier` from now on (a budget ran out mid-run, E1):
        its quota and borrowing books move, and as a new victim it may let preemption searches
        that failed before succeed now."""
        t = job.allocation.gpu_type
        self.quota.add(job.team, t, job.tier, -job.milli_held)
        del self.running_by_tier[(t, int(job.tier))][job.id]
        changed = self.team_jobs[(job.team, t)].remove(job)
        job.tier, job.borrows_at_tier2 = Tier(tier), False
        self.quota.add(job.team, t, job.tier, job.milli_held)
        self.running_by_tier[(t, int(job.tier))][job.id] = job
        changed += self._borrowing(job.team, t).add(job)
        self._rebalance(job.team, t, changed)
        self.flips[t] += 1
        self.changed(t, freed=False)
        self.dirty = True
        if self.policy.preemption:
            self.started_at = now

    def give_notice(self, job: Job, order: Preempt, holder: str | None = None) -> None:
        """Ask a running job to save and stop within the order's grace; it is queued again
        when the driver reports it stopped. A victim of `holder` (a preemptor holding GPUs for
        it): its stop lets the hold go on, and a fractional one closes its shared GPU to
        newcomers while it saves."""
        self.decisions.append(order)
        job.preemptions += 1
        job.preempting = True
        self.pending_stops[job.id] = order
        if holder is not None:
            self.hold_of[job.id] = holder
            if job.spec.gpu_milli < MILLI:
                self.shared.close(*shared_gpu(job.allocation))

    def stop_now(self, job: Job, order: Preempt, now: float) -> None:
        """Stop a running job at once (an order without grace) and queue it again with what
        its checkpoint kept, or all its work where the policy suspends by saving."""
        self.decisions.append(order)
        job.preemptions += 1
        self.stop(job, now, keep_all=self.policy.suspend_saves)

    def forget_stop(self, job_id: str) -> Preempt | None:
        """The stop order the job was under, if any: it ended, stopped or failed."""
        return self.pending_stops.pop(job_id, None)

    def rule_out_move(self, job: Job, gpu_type: str) -> None:
        """The running job can gain nothing by moving to `gpu_type` for the rest of its run:
        drop it from `slower_than` there until it starts again or is resized."""
        del self.slower_than[gpu_type][job.id]

    def take_out(self, node: int, drain: bool) -> None:
        """Take a node out of placement: down (its jobs are failed by the caller) or drained
        (its jobs run on, nothing new starts there). Holds on it are given up."""
        self.spares.lost(node)
        self.index.set_down(node)
        if drain:
            self.drained.add(node)
        else:
            self.drained.discard(node)
        self.changed(self.index.node_type[node], freed=False)
        for hold in [h for h in self.holds.values() if node in h.allocation.nodes]:
            self.cancel_hold(hold)

    def put_back(self, node: int) -> None:
        """A node out of placement is in service again, with the GPUs its running jobs and
        holds still use busy; wholly free, it refills the hot spares first."""
        self.drained.discard(node)
        self.dirty = True
        busy = 0
        for job_id in self.node_jobs[node]:
            for n, gpus in self.running[job_id].allocation.slots:
                if n == node:
                    busy |= gpus_to_mask(gpus)
        for hold in self.holds.values():
            for n, mask in hold.held:
                if n == node:
                    busy |= mask
        self.index.set_up(node, busy)
        self.changed(self.index.node_type[node], freed=True)
        if not busy:
            self.spares.refill(node)

    def reserve_spare(self, node: int) -> None:
        """Hold a wholly free node back as a hot spare (F2, `engine.spares`)."""
        self.spares.reserve(node)
        self.changed(self.index.node_type[node], freed=False)
