"""The engine as the live control plane needs it: the simulator's `Scheduler`, plus what only a
driver of real executors needs — re-entering a job at the tier it had, adopting a job that is
already running on known GPUs (after a restart or an engine rebuild), and losing one job to a
node failure that the executor reports for the job rather than for the node.

Both use the scheduler's own state-change steps, so the indexes, quota and fair-share books
stay exactly as if the engine had started the job itself; the Start decision that step records
is dropped because the job is already running.
"""

from __future__ import annotations

from typing import Any

from gpu_arbiter.domain import MILLI, Allocation, InvalidInput, Job, JobSpec, JobState, Start, Tier
from gpu_arbiter.engine import Scheduler
from gpu_arbiter.engine.placement import gpus_to_mask


class LiveScheduler(Scheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Jobs that reported a checkpoint through the SDK: they keep checkpoints even without a
        # declared interval, so a failure does not demote them (E3).
        self.sdk_checkpoints: set[str] = set()

    def checkpoints(self, job: Job) -> bool:
        return job.id in self.sdk_checkpoints or super().checkpoints(job)

    def lost(self, job_id: str, now: float) -> Job:
        """A running job's node failed under it, and the executor said so for the job (Slurm's
        NODE_FAIL) before or without the node being seen down: the same as `node_down` does
        for each job of a failed node — a restart, requeued with what its checkpoint kept,
        demoted only without checkpoints (E3), on a hot spare first when one is held (F2)."""
        job = self.running.get(job_id)
        if job is None:
            raise InvalidInput(f"job {job_id!r} is not running")
        self.pending_stops.pop(job_id, None)
        demote = (
            self.cfg.demote_after_uncheckpointed_failure
            and not self.checkpoints(job)
            and job.tier < Tier.EXPLORATORY
        )
        job.restarts += 1
        self._stop(job, now, keep_all=False, demote=demote)
        self._victim_gone(job_id, now)
        self._restart_on_spares([job], now)
        return job

    def resubmit(self, spec: JobSpec, submitted_at: float, tier: Tier) -> Job:
        """Queue a job known from the database at the tier it last ran at (a failure may have
        demoted it, E3)."""
        job = self.submit(spec, submitted_at)
        if job.tier != tier:
            self.queue.remove(job)
            job.tier = Tier(tier)
            self.queue.add(job)
        return job

    def adopt(self, job: Job, allocation: Allocation, started_at: float) -> None:
        """Mark a queued job running on exactly `allocation` without a Start decision.
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
        self._start(job, allocation, started_at)
        last = self._decisions.pop()
        assert isinstance(last, Start) and last.job_id == job.id

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
