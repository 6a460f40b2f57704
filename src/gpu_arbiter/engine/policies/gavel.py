"""Gavel (Narayanan et al., OSDI '20): heterogeneity-aware max-min fairness, in rounds.

The baseline follows Gavel's own scheduler (github.com/stanford-futuredata/gavel, its policy
`max_min_fairness_perf` and its round mechanism); its rules:

- An allocation says which fraction of time each job should spend on each GPU type: Gavel's
  max-min fairness LP (`gavel_lp`), with each job's throughput its speed on the type times its
  GPU count. It is recomputed, over the jobs then active, only when jobs arrived or left since
  the last time, and at most once per `reset_interval_s` (Gavel's default 1920 s; 0 for every
  round). Recomputing resets what each job received so far: what it lacked of its last
  allocation is kept as its deficit.
- Time runs in rounds of `round_s` (360 s). Jobs that arrive during a round wait for its end; a
  round ends early once every job in it has finished, and a round starts at once on an idle
  cluster.
- At a round's start each job's priority on each type is its allocation there over the share
  of the type's time it received since the last reset (a job starts the period at half a
  round); a job with no allocation on a type has priority 0 there, and ties go to the larger
  deficit, then the larger allocation. Types are filled fastest first, each from its own
  priority list, skipping jobs already placed and jobs that do not fit in what is left, so
  jobs of priority 0 fill GPUs nobody else wants.
- A job that arrived after the last reset is in no allocation: chosen, it still gets no GPUs,
  which stay idle for the round (Gavel gives it no workers). A round nobody could be given
  GPUs in lasts until the next event or until a reset is allowed (Gavel's simulator jumps to
  the next arrival, which a live scheduler cannot know).
- A job chosen for the type it runs on keeps its GPUs; any other running job is suspended: it
  saves its checkpoint as its lease ends and keeps all its progress. The chosen jobs start
  largest first, on their chosen type; a job that does not fit there (Gavel has no topology,
  Arbiter's nodes do) may take GPUs of another type that no chosen job waits for, or else
  waits for the next round.

Gavel ignores tiers and teams.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from gpu_arbiter.domain import Job, JobState
from gpu_arbiter.engine.policy import Backfill, Heterogeneity, Policy, SchedulerView

ROUND_S = 360.0
RESET_INTERVAL_S = 1920.0  # Gavel's `minimum_time_between_allocation_resets`
_ENDED = (JobState.COMPLETED, JobState.CANCELLED, JobState.FAILED)


class GavelPolicy(Policy):
    name = "gavel"
    quotas = False
    preemption = False
    backfill = Backfill.GREEDY
    elastic = False
    heterogeneity = Heterogeneity.ANY
    tiers = False
    incremental = False
    suspend_saves = True

    def __init__(
        self, reset_interval_s: float = RESET_INTERVAL_S, round_s: float = ROUND_S
    ) -> None:
        self.reset_interval_s = reset_interval_s
        self.round_s = round_s
        self.allocation: dict[str, dict[str, float]] = {}
        self.received: dict[str, dict[str, float]] = {}  # job -> type -> s since the reset
        self.type_time: dict[str, float] = {}  # type -> s of all jobs since the reset
        self.deficit: dict[str, dict[str, float]] = {}  # job -> type -> s owed at resets
        self.last_reset = 0.0
        self.stale = False  # jobs arrived or left since the allocation was computed
        self.plan: dict[str, str] = {}  # this round: job -> type
        self.round: list[Job] = []  # this round's jobs, in the order they start
        self.round_start = 0.0
        self.next_round = 0.0
        self.unplaced = 0  # chosen jobs that found no room to start in their round

    def group_key(self, job: Job) -> int:
        return 0

    def before_cycle(self, sched: SchedulerView, now: float) -> None:
        if now < self.next_round and not all(j.state in _ENDED for j in self.round):
            return
        self._account(now)
        active = self._sync(sched)
        capacity = _capacity(sched)
        # As in Gavel, a last reset at time 0 counts as none yet.
        if self.stale and (now - self.last_reset >= self.reset_interval_s or self.last_reset == 0):
            self._reset(sched, active, capacity, now)
        self._choose(sched, active, capacity)
        self.round_start = now
        # A round with nobody in it does not end on its own (Gavel's clock jumps to the next
        # arrival): the next event starts the next one, or at latest the next possible reset.
        self.next_round = (
            now + self.round_s if self.round else self.last_reset + self.reset_interval_s
        )
        for job in list(sched.running.values()):
            if not job.preempting and self.plan.get(job.id) != job.allocation.gpu_type:
                sched.preempt(job, now, "gavel round: not chosen for this type this round")

    def _account(self, now: float) -> None:
        """Credit the round that ends to the jobs that ran in it and to their types."""
        for job in self.round:
            t = self.plan[job.id]  # a finished job counts there (see `candidate_types`)
            if job.state == JobState.RUNNING:
                t = job.allocation.gpu_type
                ran = now - max(self.round_start, job.segment_start)
            elif job.state == JobState.COMPLETED:
                ran = job.finished_at - max(self.round_start, job.segment_start)
            else:
                if job.state == JobState.PENDING:
                    self.unplaced += 1
                continue
            self.type_time[t] = self.type_time.get(t, 0.0) + ran
            if job.id in self.received:
                self.received[job.id][t] += ran

    def _sync(self, sched: SchedulerView) -> list[Job]:
        """The active jobs, by arrival; jobs that arrived start with half a round received on
        every type, and jobs that left are forgotten: either makes the allocation stale."""
        active = sorted(
            [
                *sched.running.values(),
                *(j for j in sched.queue.jobs() if j.state == JobState.PENDING),
            ],
            key=lambda j: j.seq,
        )
        ids = {j.id for j in active}
        for gone in [i for i in self.received if i not in ids]:
            del self.received[gone]
            self.deficit.pop(gone, None)
            self.stale = True
        types = list(sched.index.type_total)
        for job in active:
            if job.id not in self.received:
                self.received[job.id] = dict.fromkeys(types, self.round_s / 2)
                self.deficit[job.id] = dict.fromkeys(types, 0.0)
                self.stale = True
        return active

    def _reset(
        self, sched: SchedulerView, active: list[Job], capacity: dict[str, int], now: float
    ) -> None:
        """Keep what each job lacked of its allocation as deficit, start a new period and
        solve the LP over the active jobs."""
        elapsed = now - self.last_reset
        half = self.round_s / 2
        for t in capacity:
            for job_id, got in self.received.items():
                owed = self.allocation.get(job_id, {}).get(t, 0.0) * elapsed
                self.deficit[job_id][t] += owed - (got[t] - half)
                got[t] = half
            self.type_time[t] = half * len(self.received)
        types = [t for t in capacity if capacity[t] > 0]
        runs = [j for j in active if any(t in types for t in sched.types_by_speed(j))]
        throughput = np.array(
            [
                [
                    sched.speed(j, t) * j.spec.gpus if t in sched.types_by_speed(j) else 0.0
                    for t in types
                ]
                for j in runs
            ]
        ).reshape(len(runs), len(types))
        # Imported here: scipy takes the better part of a second to load, and only this policy
        # needs it (every other policy, the simulator and the live service import this module).
        from gpu_arbiter.engine.policies.gavel_lp import max_min_allocation

        x = max_min_allocation(
            throughput, [j.spec.gpus for j in runs], [capacity[t] for t in types]
        )
        self.allocation = {
            j.id: dict(zip(types, row.tolist(), strict=True))
            for j, row in zip(runs, x, strict=True)
        }
        self.last_reset = now
        self.stale = False

    def _choose(self, sched: SchedulerView, active: list[Job], capacity: dict[str, int]) -> None:
        """This round's jobs and types: each type, fastest first, from its priority list."""
        entries = []
        for t in sorted(capacity, key=lambda t: -sched.cluster.gpu_types[t].speed):
            ranked = []
            for job in active:
                share = self.allocation.get(job.id, {}).get(t, 0.0)
                ranked.append(
                    (self._priority(sched, job, t, share), self.deficit[job.id][t], share, job)
                )
            ranked.sort(key=lambda e: e[:3], reverse=True)
            entries += [(job, t) for *_, job in ranked]
        left = dict(capacity)
        plan: dict[str, str] = {}
        for job, t in entries:
            if left[t] == 0 or job.id in plan or t not in sched.types_by_speed(job):
                continue
            if job.spec.gpus <= left[t]:
                left[t] -= job.spec.gpus
                plan[job.id] = t
        # Gavel gives no workers to a job chosen before any allocation counted it.
        self.plan = {i: t for i, t in plan.items() if i in self.allocation}
        chosen = [j for j in active if j.id in self.plan]
        self.round = sorted(chosen, key=lambda j: -j.spec.gpus)

    def _priority(self, sched: SchedulerView, job: Job, t: str, share: float) -> float:
        if share <= 0 or t not in sched.types_by_speed(job):
            return 0.0
        total = self.type_time.get(t, 0.0)
        fraction = self.received[job.id][t] / total if total > 0 else 0.0
        return share / fraction if fraction > 0 else share * 1e9

    def ordered(self, sched: SchedulerView, now: float) -> Iterator[Job]:
        """This round's jobs that wait to start, largest first; nobody else."""
        return (j for j in self.round if j.state == JobState.PENDING)

    def candidate_types(self, sched: SchedulerView, job: Job) -> list[str]:
        """The chosen type; then, for a job with no room there (power, topology: Arbiter's
        nodes are no Gavel workers), the types it runs on whose free GPUs outnumber what the
        round's other waiting jobs were chosen to take there."""
        planned = self.plan.get(job.id)
        if not planned:
            return sched.types_by_speed(job)
        wanted = dict.fromkeys(sched.types_by_speed(job), job.spec.gpus)
        for other in self.round:
            if other.state == JobState.PENDING and other is not job:
                t = self.plan[other.id]
                if t in wanted:
                    wanted[t] += other.spec.gpus
        free = sched.index.type_free
        return [planned] + [t for t, n in wanted.items() if t != planned and free[t] >= n]

    def next_wakeup(self, sched: SchedulerView, now: float) -> float | None:
        if not len(sched.queue) and not sched.running:
            return None
        return self.next_round if self.next_round > now else now + self.round_s


def _capacity(sched: SchedulerView) -> dict[str, int]:
    """GPUs of each type on nodes that are up."""
    left = dict(sched.index.type_total)
    for node, is_down in enumerate(sched.index.down):
        if is_down:
            left[sched.index.node_type[node]] -= sched.index.size[node]
    return left
