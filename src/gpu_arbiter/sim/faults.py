"""Reliability in the simulator (F1-F5): failure injection, hot spares, MTTR and breaker trips.

The glue between `gpu_arbiter.reliability` (what fails, when, and what a breaker sees) and the
engine (who loses what, who restarts where). Everything is drawn from seeds, so a run repeats
exactly:

* faults come lazily from `FailureModel.iter_faults`: one fault is on the event heap at a time
  and the next is pushed when it fires. A fatal fault cordons its node (`Scheduler.node_down`):
  its jobs lose the work since their last checkpoint and restart, on a hot spare when one is
  free; the node comes back at its repair time. A non-fatal fault (thermal throttling) is only
  counted;
* node MTTR runs from the fault to the repair; job recovery from the fault to the moment the
  restarted job makes progress again (its checkpoint restored);
* a job given a pathology (`JobSpec.pathology`) gets a telemetry stream from
  `reliability.telemetry_stream`; when it starts, the breakers are run over that stream and
  the first detection becomes one trip event. A team whose policy is STOP has the job stopped
  and its GPUs released; the GPU time it would still have burned is *saved by the breaker*.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from gpu_arbiter.domain import Cluster, InvalidInput, Job, JobState
from gpu_arbiter.engine import Scheduler
from gpu_arbiter.reliability import (
    Action,
    BreakerConfig,
    BreakerPolicy,
    Detection,
    FailureModel,
    MttrTracker,
    NodeFault,
    Pathology,
    SparePool,
    detect,
)

# Pushes an event onto the simulator's heap: (time, kind, key, version).
Push = Callable[[float, int, str, int], None]


@dataclass(frozen=True, slots=True)
class ReliabilityConfig:
    """What the simulator injects. Failures are on by default at SPEC F3's rates; `seed` makes
    them repeat. `spares_per_type` hot spare nodes of each GPU type are held back (F2).
    `breakers` None turns the circuit breakers off; `team_breakers` overrides it per team.
    `script`, when given, replaces the model by exactly these faults (a replayed fault log, or
    a test's scenario)."""

    seed: int = 0
    failures: bool = True
    gpu_afr: float = 0.04
    node_afr: float = 0.05
    spares_per_type: int = 0
    breakers: BreakerPolicy | None = field(default_factory=BreakerPolicy)
    team_breakers: Mapping[str, BreakerPolicy] = field(default_factory=dict)
    telemetry_interval_s: float = 60.0
    script: tuple[NodeFault, ...] | None = None

    def __post_init__(self) -> None:
        if self.spares_per_type < 0:
            raise InvalidInput(
                f"reliability: spares_per_type must be >= 0, got {self.spares_per_type}"
            )
        if not (self.telemetry_interval_s > 0 and math.isfinite(self.telemetry_interval_s)):
            raise InvalidInput(
                f"reliability: telemetry_interval_s must be > 0, got {self.telemetry_interval_s}"
            )


class SimReliability:
    """Failure, repair and breaker events of one simulation run (see the module docstring)."""

    def __init__(self, cluster: Cluster, sched: Scheduler, cfg: ReliabilityConfig) -> None:
        self.cfg = cfg
        self.sched = sched
        if cfg.spares_per_type:
            pool = SparePool.from_cluster(cluster, per_type=cfg.spares_per_type)
            sched.reserve_spares(n.name for n in pool.free)
        self._faults: Iterator[NodeFault] | None = None
        if cfg.script is not None:
            for f in cfg.script:
                cluster.node(f.node)  # an unknown node is refused here, not mid-run
            self._faults = iter(sorted(cfg.script, key=lambda f: (f.at, f.node)))
        elif cfg.failures:
            model = FailureModel(cfg.seed, cfg.gpu_afr, cfg.node_afr)
            self._faults = model.iter_faults(cluster)
        self._next: NodeFault | None = None
        self._down_until: dict[str, float] = {}
        self.node_mttr = MttrTracker()
        self.job_recovery = MttrTracker()
        self.faults = 0
        self.failures = 0
        self.failure_lost_gpu_s = 0.0
        self.spare_restarts = 0
        self.trips = 0
        self.trips_stopped = 0
        self.saved_gpu_s = 0.0
        self._run: dict[str, int] = {}  # starts per job, so a stale trip is recognised
        self.events: list[dict] = []

    @property
    def injecting(self) -> bool:
        """Whether faults keep coming (the run must then end when the jobs are done)."""
        return self._faults is not None

    def push_next_fault(self, push: Push, kind: int) -> None:
        if self._faults is None:
            return
        self._next = next(self._faults, None)
        if self._next is None:
            self._faults = None
            return
        push(self._next.at, kind, self._next.node, 0)

    def fault(self, now: float, push: Push, repair_kind: int) -> list[str]:
        """The pending fault fires (a fatal one schedules its repair); returns the ids of the
        jobs it stopped."""
        fault = self._next
        assert fault is not None
        self._next = None
        self.faults += 1
        if not fault.fatal:
            self.events.append(
                {"t": now, "kind": "fault", "node": fault.node, "fault": fault.kind.value}
            )
            return []
        self.failures += 1
        self.node_mttr.fault(fault.node, now)
        self._down_until[fault.node] = max(self._down_until.get(fault.node, 0.0), fault.repaired_at)
        push(fault.repaired_at, repair_kind, fault.node, 0)
        node = self.sched.cluster.node(fault.node).index
        before = sum(self.sched.jobs[j].lost_gpu_s for j in self.sched.node_jobs[node])
        spares = set(self.sched.spares.free)
        affected = self.sched.node_down(fault.node, now)
        jobs = [self.sched.jobs[j] for j in affected]
        self.failure_lost_gpu_s += sum(j.lost_gpu_s for j in jobs) - before
        self.spare_restarts += sum(
            1 for j in jobs if j.allocation and not spares.isdisjoint(j.allocation.nodes)
        )
        for job in jobs:
            self.job_recovery.fault(job.id, now)
        self.events.append(
            {
                "t": now,
                "kind": "failure",
                "node": fault.node,
                "fault": fault.kind.value,
                "jobs": affected,
            }
        )
        return affected

    def repaired(self, node: str, now: float) -> bool:
        """A repair event fires; the node comes back unless a later fault keeps it down."""
        if now < self._down_until.get(node, math.inf):
            return False
        del self._down_until[node]
        self.sched.node_up(node, now)
        self.node_mttr.recovered(node, now)
        return True

    def started(self, job: Job, now: float, push: Push, kind: int) -> None:
        """A Start decision was applied: a displaced job has recovered, and a pathological job
        gets its breaker trip scheduled for this run."""
        self.job_recovery.recovered(job.id, max(now, job.stalled_until))
        run = self._run[job.id] = self._run.get(job.id, 0) + 1
        policy = self._policy(job.team)
        spec = job.spec
        if spec.pathology is None or policy is None or job.rate <= 0:
            return
        begin = max(now, job.stalled_until)
        # The pathology belongs to the job's progress: a restart reaches it again.
        onset = max(0.0, (spec.pathology_onset_s - job.progress_s) / job.rate)
        seed = zlib.crc32(f"{self.cfg.seed}:{job.id}".encode())
        found = _detection(
            spec.pathology, seed, self.cfg.telemetry_interval_s, round(onset), policy.config
        )
        if found is not None:
            push(begin + found.at, kind, job.id, run)

    def trip(self, job_id: str, run: int, now: float) -> bool:
        """A breaker trip event fires; True when it stopped the job. A trip of an earlier run
        (the job was stopped, finished or restarted since) is ignored."""
        job = self.sched.jobs[job_id]
        if job.state != JobState.RUNNING or self._run.get(job_id) != run:
            return False
        policy = self._policy(job.team)
        assert policy is not None and job.spec.pathology is not None
        self.trips += 1
        event = {"t": now, "kind": "breaker", "job": job_id, "pathology": job.spec.pathology}
        self.events.append(event)
        if policy.action is not Action.STOP:
            event["action"] = Action.FLAG.value
            return False
        event["action"] = Action.STOP.value
        job.advance(now)
        self.saved_gpu_s += job.remaining_s / job.rate * job.gpu_share
        self.sched.cancel(job_id, now)
        self.trips_stopped += 1
        return True

    def kpis(self) -> dict:
        mttr = self.node_mttr.mttr_s
        recovery = self.job_recovery.mttr_s
        return {
            "faults": self.faults,
            "failures": self.failures,
            "mttr_s": mttr if mttr is not None else 0.0,
            "job_recovery_s": recovery if recovery is not None else 0.0,
            "failure_lost_gpu_hours": self.failure_lost_gpu_s / 3600,
            "spare_restarts": self.spare_restarts,
            "breaker_trips": self.trips,
            "breaker_stops": self.trips_stopped,
            "gpu_hours_saved_by_breakers": self.saved_gpu_s / 3600,
        }

    def _policy(self, team: str) -> BreakerPolicy | None:
        return self.cfg.team_breakers.get(team, self.cfg.breakers)


@lru_cache(maxsize=4096)
def _detection(
    pathology: str, seed: int, interval_s: float, onset_s: float, config: BreakerConfig
) -> Detection | None:
    return detect(Pathology(pathology), seed, interval_s, onset_s, config)
