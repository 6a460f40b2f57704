"""Which running jobs of a team run on borrowed capacity (S2), kept incrementally.

A team's running jobs of one GPU type fill its quota in order of tier, then age (submission
sequence); a job whose GPUs, added to those of the jobs before it, exceed the quota is borrowed.
The running totals only grow along that order, so the borrowed jobs are always a suffix of it.
`Borrowing` keeps the order and the length of the unborrowed prefix, so a start, stop or resize
moves that boundary by the few jobs that cross it instead of walking every running job.
"""

from __future__ import annotations

from sortedcontainers import SortedList

from gpu_arbiter.domain import Job, Tier


class Borrowing:
    """The jobs of one team on one GPU type against its quota of `limit` thousandths of a GPU
    (each job counts its `Job.milli_held`, so a fractional job its share, as in `QuotaBook`)."""

    __slots__ = ("limit", "order", "held", "jobs", "within", "within_milli", "tier1_milli")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.order = SortedList()  # (tier, seq, job id)
        self.held: dict[str, int] = {}  # what each job was counted with
        self.jobs: dict[str, Job] = {}
        self.within = 0  # the first `within` jobs of `order` run within the quota
        self.within_milli = 0  # what they hold
        self.tier1_milli = 0

    @property
    def tier1_excess(self) -> int:
        """Tier-1 use beyond the quota: what the team's tier-1 jobs take from the pool."""
        return max(0, self.tier1_milli - self.limit)

    def add(self, job: Job) -> list[Job]:
        """Count a running job; returns the jobs whose borrowed flag must change (it included)."""
        key = (int(job.tier), job.seq, job.id)
        held = job.milli_held
        self.order.add(key)
        self.held[job.id] = held
        self.jobs[job.id] = job
        if job.tier == Tier.CORE:
            self.tier1_milli += held
        changed = [job]
        if self.order.index(key) < self.within:
            # It lands in the unborrowed prefix: jobs at the end of the prefix may be pushed out.
            self.within += 1
            self.within_milli += held
            while self.within_milli > self.limit:
                self.within -= 1
                last = self.order[self.within][2]
                self.within_milli -= self.held[last]
                if last != job.id:
                    changed.append(self.jobs[last])
        changed += self._extend(skip=job.id)
        return changed

    def remove(self, job: Job) -> list[Job]:
        """Forget a job that stops running or is about to be resized (uses what it was counted
        with); returns the other jobs whose borrowed flag must change."""
        key = (int(job.tier), job.seq, job.id)
        pos = self.order.index(key)
        held = self.held.pop(job.id)
        del self.jobs[job.id]
        self.order.remove(key)
        if job.tier == Tier.CORE:
            self.tier1_milli -= held
        if pos < self.within:
            self.within -= 1
            self.within_milli -= held
        return self._extend()

    def borrowed(self, job: Job) -> bool:
        return self.order.index((int(job.tier), job.seq, job.id)) >= self.within

    def _extend(self, skip: str | None = None) -> list[Job]:
        """Move the boundary forward over jobs that now fit in the quota."""
        changed = []
        while self.within < len(self.order):
            first = self.order[self.within][2]
            held = self.held[first]
            if self.within_milli + held > self.limit:
                break
            self.within += 1
            self.within_milli += held
            if first != skip:
                changed.append(self.jobs[first])
        return changed
