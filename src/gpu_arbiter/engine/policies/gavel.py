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
        # The jobs tracked since the last round (the active ones, by arrival), one row each:
        self.ids: list[str] = []
        self.row: dict[str, int] = {}
        self.types: list[str] = []  # the cluster's types, a column each
        self.col: dict[str, int] = {}
        self.received = np.zeros((0, 0))  # s on each type since the reset
        self.deficit = np.zeros((0, 0))  # s owed on each type at resets
        self.share = np.zeros((0, 0))  # the allocation (0: none)
        self.allocated = np.zeros(0, dtype=bool)  # whether the allocation counts the job
        self.runs_on = np.zeros((0, 0), dtype=bool)  # the types the job runs on
        self.gpus = np.zeros(0, dtype=np.int64)
        self.type_time = np.zeros(0)  # s of all jobs on each type since the reset
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
            self.type_time[self.col[t]] += ran
            row = self.row.get(job.id)
            if row is not None:
                self.received[row, self.col[t]] += ran

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
        ids = [j.id for j in active]
        if ids == self.ids:
            return active
        if not self.types:
            self.types = list(sched.index.type_total)
            self.col = {t: k for k, t in enumerate(self.types)}
            self.type_time = np.zeros(len(self.types))
            self.received = self.deficit = np.zeros((0, len(self.types)))
        if set(ids) != set(self.ids):
            self.stale = True
        old = np.array([self.row.get(i, -1) for i in ids], dtype=np.int64)
        kept = old >= 0
        shape = (len(ids), len(self.types))
        received = np.full(shape, self.round_s / 2)
        received[kept] = self.received[old[kept]]
        deficit = np.zeros(shape)
        deficit[kept] = self.deficit[old[kept]]
        self.received, self.deficit = received, deficit
        self.runs_on = np.array(
            [[t in sched.types_by_speed(j) for t in self.types] for j in active], dtype=bool
        ).reshape(shape)
        self.gpus = np.array([j.spec.gpus for j in active], dtype=np.int64)
        self.ids = ids
        self.row = {i: k for k, i in enumerate(ids)}
        self._read_allocation()
        return active

    def _read_allocation(self) -> None:
        """Each tracked job's row of the allocation."""
        self.allocated = np.array([i in self.allocation for i in self.ids], dtype=bool)
        self.share = np.array(
            [[self.allocation.get(i, {}).get(t, 0.0) for t in self.types] for i in self.ids]
        ).reshape(len(self.ids), len(self.types))

    def _reset(
        self, sched: SchedulerView, active: list[Job], capacity: dict[str, int], now: float
    ) -> None:
        """Keep what each job lacked of its allocation as deficit, start a new period and
        solve the LP over the active jobs."""
        elapsed = now - self.last_reset
        half = self.round_s / 2
        self.deficit += self.share * elapsed - (self.received - half)
        self.received[:] = half
        self.type_time[:] = half * len(self.ids)
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
        self._read_allocation()
        self.last_reset = now
        self.stale = False

    def _choose(self, sched: SchedulerView, active: list[Job], capacity: dict[str, int]) -> None:
        """This round's jobs and types: each type, fastest first, from its priority list."""
        plan: dict[str, str] = {}
        taken = np.zeros(len(self.ids), dtype=bool)
        for t in sorted(capacity, key=lambda t: -sched.cluster.gpu_types[t].speed):
            left = capacity[t]
            if left == 0:
                continue
            c = self.col[t]
            fits = self.runs_on[:, c] & ~taken & (self.gpus <= left)
            if not fits.any():
                continue
            order = np.lexsort(
                (-self.share[:, c], -self.deficit[:, c], -self._priorities(c))
            )  # stable: ties keep the order of arrival
            order = order[fits[order]]
            smallest = int(self.gpus[order].min())
            for k in order.tolist():
                gpus = int(self.gpus[k])
                if gpus <= left:
                    left -= gpus
                    taken[k] = True
                    plan[self.ids[k]] = t
                    if left < smallest:
                        break
        # Gavel gives no workers to a job chosen before any allocation counted it.
        self.plan = {i: t for i, t in plan.items() if self.allocated[self.row[i]]}
        chosen = [j for j in active if j.id in self.plan]
        self.round = sorted(chosen, key=lambda j: -j.spec.gpus)

    def _priorities(self, c: int) -> np.ndarray:
        """Each job's priority on the type of column `c`: its allocation there over the share
        of the type's time it received since the reset (0 with no allocation there)."""
        share = self.share[:, c]
        total = self.type_time[c]
        fraction = self.received[:, c] / total if total > 0 else np.zeros_like(share)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(fraction > 0, share / fraction, share * 1e9)
        return np.where((share > 0) & self.runs_on[:, c], ratio, 0.0)

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
        free = sched.index.type_free
        others = [t for t in sched.types_by_speed(job) if t != planned and free[t] >= job.spec.gpus]
        if not others:
            return [planned]
        wanted = dict.fromkeys(others, job.spec.gpus)
        for other in self.round:
            if other.state == JobState.PENDING and other is not job:
                t = self.plan[other.id]
                if t in wanted:
                    wanted[t] += other.spec.gpus
        return [planned] + [t for t in others if free[t] >= wanted[t]]

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
