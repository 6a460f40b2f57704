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
  and its GPUs released; the GPU time it would still have burned is *saved by the breaker*;
* degraded nodes (`degraded_afr` > 0; off by default, so results stay comparable): a node whose
  NIC went slow keeps running, but every multi-node job on it runs `degraded_slowdown` times
  slower (its slowest rank sets the pace) until the straggler watch catches the node
  (`reliability.stragglers.detect`, the same watch the control plane runs on live reports) or
  the node is repaired. A caught node is drained (no new work) and its multi-node jobs restart
  from their checkpoints at once; unlike the live service, which restarts them once healthy
  GPUs are free, they then wait in the queue. The slow stretch is modelled as a stall followed
  by full speed, which gives the same progress and end; its GPU time is held but not useful,
  so it shows in goodput, and as `straggler_slow_gpu_hours`.
"""

from __future__ import annotations

import heapq
import math
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from gpu_arbiter.domain import Cluster, InvalidInput, Job, JobState
from gpu_arbiter.engine import Scheduler
from gpu_arbiter.reliability import (
    DEGRADED_KINDS,
    Action,
    BreakerConfig,
    BreakerPolicy,
    Detection,
    FailureModel,
    FaultKind,
    MttrTracker,
    NodeFault,
    Pathology,
    SparePool,
    detect,
    gpu_s_saved_by_stop,
)
from gpu_arbiter.reliability.stragglers import StragglerConfig
from gpu_arbiter.reliability.stragglers import detect as detect_straggler

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
    # Degraded nodes: episodes per node-year (0: none), how much slower a gang on one runs, and
    # the straggler watch that catches them (None: never caught, until the repair).
    degraded_afr: float = 0.0
    degraded_slowdown: float = 2.0
    stragglers: StragglerConfig | None = field(default_factory=StragglerConfig)

    def __post_init__(self) -> None:
        if self.spares_per_type < 0:
            raise InvalidInput(
                f"reliability: spares_per_type must be >= 0, got {self.spares_per_type}"
            )
        if not (self.degraded_afr >= 0 and math.isfinite(self.degraded_afr)):
            raise InvalidInput(f"reliability: degraded_afr must be >= 0, got {self.degraded_afr}")
        if not (self.degraded_slowdown >= 1 and math.isfinite(self.degraded_slowdown)):
            raise InvalidInput(
                f"reliability: degraded_slowdown must be >= 1, got {self.degraded_slowdown}"
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
        if cfg.script is None and cfg.degraded_afr > 0:
            slow = FailureModel(cfg.seed, 0.0, cfg.degraded_afr, DEGRADED_KINDS, stream=1)
            streams = [f for f in (self._faults, slow.iter_faults(cluster)) if f is not None]
            self._faults = heapq.merge(*streams, key=lambda f: (f.at, f.node))
        self._degraded: dict[str, float] = {}  # degraded node -> its repair time
        self._slowed: list[str] = []  # jobs whose pace changed: their ends move
        self._slowed_run: dict[str, int] = {}  # the run of each job that was slowed
        self.degraded = 0
        self.stragglers = 0
        self.straggler_restarts = 0
        self.slow_gpu_s = 0.0
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

    def fault(
        self, now: float, push: Push, repair_kind: int, straggler_kind: int = -1
    ) -> list[str]:
        """The pending fault fires (a fatal one schedules its repair); returns the ids of the
        jobs it stopped."""
        fault = self._next
        assert fault is not None
        self._next = None
        self.faults += 1
        if fault.kind is FaultKind.NIC_DEGRADED:
            self._degrade(fault, now, push, repair_kind, straggler_kind)
            return []
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
        if now >= self._degraded.get(node, math.inf):
            del self._degraded[node]
            index = self.sched.cluster.node(node).index
            if index in self.sched.drained:
                self.sched.node_up(node, now)
                return True
        if now < self._down_until.get(node, math.inf):
            return False
        del self._down_until[node]
        self.sched.node_up(node, now)
        self.node_mttr.recovered(node, now)
        return True

    def started(
        self, job: Job, now: float, push: Push, kind: int, straggler_kind: int = -1
    ) -> None:
        """A Start decision was applied: a displaced job has recovered, and a pathological job
        gets its breaker trip scheduled for this run."""
        self.job_recovery.recovered(job.id, max(now, job.stalled_until))
        run = self._run[job.id] = self._run.get(job.id, 0) + 1
        for name in self._slow_nodes(job):
            self._slow(job, name, now, push, straggler_kind)
            break
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
        self.saved_gpu_s += gpu_s_saved_by_stop(job, now)
        self.sched.cancel(job_id, now)
        self.trips_stopped += 1
        return True

    def take_slowed(self) -> list[str]:
        """The jobs whose pace changed since the last call (the driver moves their ends)."""
        slowed, self._slowed = self._slowed, []
        return slowed

    def _degrade(
        self, fault: NodeFault, now: float, push: Push, repair_kind: int, straggler_kind: int
    ) -> None:
        """A node's NIC went slow: every multi-node job on it slows down from now."""
        self.degraded += 1
        until = max(self._degraded.get(fault.node, 0.0), fault.repaired_at)
        self._degraded[fault.node] = until
        push(until, repair_kind, fault.node, 0)
        self.events.append({"t": now, "kind": "degraded", "node": fault.node})
        node = self.sched.cluster.node(fault.node).index
        for job_id in sorted(self.sched.node_jobs[node]):
            job = self.sched.jobs[job_id]
            if len(job.allocation.nodes) > 1:
                self._slow(job, fault.node, now, push, straggler_kind)

    def _slow_nodes(self, job: Job) -> list[str]:
        """The degraded nodes, not yet caught, that a multi-node job runs on."""
        if not self._degraded or job.allocation is None or len(job.allocation.nodes) < 2:
            return []
        names = (self.sched.cluster.nodes[n].name for n in job.allocation.nodes)
        return [n for n in names if n in self._degraded]

    def _slow(self, job: Job, node: str, now: float, push: Push, kind: int) -> None:
        """The job runs at 1/slowdown pace from `now` until its node is caught (an event is
        pushed for then), repaired, or the job is done, whichever comes first."""
        cfg = self.cfg
        s = cfg.degraded_slowdown
        run = self._run.get(job.id, 0)
        if s <= 1 or job.rate <= 0 or job.preempting or self._slowed_run.get(job.id) == run:
            return  # a run is slowed once, by the first degraded node it meets (a job on
            # its way out is left to stop)
        self._slowed_run[job.id] = run
        until = self._degraded[node]
        if cfg.stragglers is not None:
            slots = job.allocation.slots
            found = detect_straggler(
                tuple(len(g) for _, g in slots),
                [self.sched.cluster.nodes[n].name for n, _ in slots].index(node),
                s,
                cfg.telemetry_interval_s,
                cfg.stragglers,
                until - now,
            )
            if found is not None:
                until = now + found.at
                push(until, kind, job.id, run)
        start = max(now, job.stalled_until)
        left = (job.spec.duration_s - job.progress_at(now)) / job.rate
        slow_s = min(max(0.0, until - start), left * s)
        stall = slow_s * (1 - 1 / s)
        if stall <= 0:
            return
        # A new segment from now whose first `stall` seconds make no progress: the same
        # progress and end as running slow for `slow_s`. Checkpoints taken so far stay.
        job.advance(now)
        kept = job.saved_progress(now)
        end = job.expected_end_at  # the engine's backfill books keep the user's estimate
        job.close_segment(job.progress_s)
        job.checkpoint_s = kept
        job.begin_segment(now, max(0.0, job.stalled_until - now) + stall)
        job.expected_end_at = end
        self.slow_gpu_s += stall * job.gpu_share
        self._slowed.append(job.id)

    def straggler(self, job_id: str, run: int, now: float) -> list[str]:
        """The straggler watch catches the degraded node the job runs on: the node is drained
        and its multi-node jobs restart from their checkpoints; returns their ids."""
        job = self.sched.jobs[job_id]
        if job.state != JobState.RUNNING or self._run.get(job_id) != run:
            return []
        caught = self._slow_nodes(job)
        if not caught:
            return []
        name = caught[0]
        node = self.sched.cluster.node(name).index
        self.stragglers += 1
        self.sched.drain(name)
        on_node = sorted(self.sched.node_jobs[node])
        moved = [j for j in on_node if len(self.sched.jobs[j].allocation.nodes) > 1]
        for j in moved:
            self.sched.restart(j, now)
        self.straggler_restarts += len(moved)
        self.events.append({"t": now, "kind": "straggler", "node": name, "jobs": moved})
        return moved

    def kpis(self) -> dict:
        mttr = self.node_mttr.mttr_s
        recovery = self.job_recovery.mttr_s
        degraded = {}
        if self.cfg.degraded_afr > 0 or self.degraded:
            degraded = {
                "degraded_nodes": self.degraded,
                "stragglers_caught": self.stragglers,
                "straggler_restarts": self.straggler_restarts,
                "straggler_slow_gpu_hours": self.slow_gpu_s / 3600,
            }
        return {
            **degraded,
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
