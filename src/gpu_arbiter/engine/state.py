"""The engine's running state and its only mutators: start, release, stop, resize, hold (and
its end), adopt and move_gpus. Each keeps the capacity index, the running indexes (by type,
tier, team, expected end, node), quota and fair-share books and the borrowed flags in step."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpu_arbiter.domain import MILLI, Allocation, InvalidInput, Job, JobState, Resize, Start, Tier
from gpu_arbiter.engine.admission import budget_capped
from gpu_arbiter.engine.borrowing import Borrowing
from gpu_arbiter.engine.placement import gpus_to_mask


@dataclass(slots=True)
class Hold:
    """GPUs kept for a job while the tier-2 victims it preempted use up their grace."""

    job: Job
    allocation: Allocation
    waiting: set[str]
    held: list[tuple[int, int]] = field(default_factory=list)  # (node, mask) taken for it


class EngineState:
    """The state changes (mixed into `Scheduler`)."""

    def _watts(self, job: Job, gpu_type: str | None = None) -> float:
        t = gpu_type or job.allocation.gpu_type
        return self.index.watts_per_gpu(t, job.spec.power_profile)

    def _running(self, job_id: str) -> Job:
        job = self.running.get(job_id)
        if job is None:
            raise InvalidInput(f"job {job_id!r} is not running")
        return job

    def _start(self, job: Job, alloc: Allocation, now: float, decide: bool = True) -> None:
        """Run the job on `alloc` from `now`; `decide`: record the Start decision (an adopted
        job already runs)."""
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
        self.last_try.pop(job.id, None)
        self._waits.pop(job.id, None)
        self._rebalance(job.team, t, changed)
        if decide:
            self._decisions.append(Start(job.id, alloc, job.borrowed))

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
        self._start(job, allocation, started_at, decide=False)

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
        w = self._watts(job)
        for node, gpus in old.slots:
            self.index.give(node, gpus_to_mask(gpus), w)
        new = [(node, gpus_to_mask(gpus)) for node, gpus in allocation.slots]
        fits = all(self.index.free_mask[node] & mask == mask for node, mask in new)
        for node, mask in new if fits else [(n, gpus_to_mask(g)) for n, g in old.slots]:
            self.index.take(node, mask, w)
        if fits:
            job.allocation = allocation
            self._changed(allocation.gpu_type, freed=True)  # for the engine's search caches
        return fits

    def _release(self, job: Job) -> None:
        self._dirty = True
        for faster in self.faster_types(job):
            self.slower_than[faster].pop(job.id, None)
        self.fit.forget(job.id)
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
