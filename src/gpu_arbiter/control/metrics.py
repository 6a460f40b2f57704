"""Prometheus exposition of the live KPIs (`/metrics`).

The same quantities the simulator reports (SPEC "Metrics"): utilisation, queueing delay and
completion time by tier, preemptions, fragmentation and stranded GPUs, lost GPU-hours, per-team
spend and burn rate — plus the control plane's own health (cycle time, API latency, batch
sizes). Each service has its own registry, so tests can run several in one process.

Series labelled by team live in a registry of their own (`team_registry`): what a team spends
is its business, so `exposition` shows them only to whom the API says may see them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

_DELAY_BUCKETS = (0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 86400)
_FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.gpus = Gauge("arbiter_gpus", "GPUs by state", ["state"], registry=r)
        self.utilisation = Gauge(
            "arbiter_gpu_utilisation", "Share of up GPUs held by jobs", registry=r
        )
        self.fragmentation = Gauge(
            "arbiter_fragmentation", "Share of free GPUs not on a wholly free node", registry=r
        )
        self.stranded = Gauge(
            "arbiter_stranded_gpus", "Free GPUs of types a blocked job could use", registry=r
        )
        self.jobs = Gauge("arbiter_jobs", "Jobs by state and tier", ["state", "tier"], registry=r)
        self.nodes = Gauge("arbiter_nodes", "Nodes by state", ["state"], registry=r)
        self.submissions = Counter(
            "arbiter_submissions", "Jobs accepted by the API", ["tier"], registry=r
        )
        self.preemptions = Counter(
            "arbiter_preemptions", "Jobs preempted, by victim tier", ["tier"], registry=r
        )
        self.ended = Counter("arbiter_jobs_ended", "Jobs that ended", ["state"], registry=r)
        self.queue_delay = Histogram(
            "arbiter_queue_delay_seconds",
            "Submission to first start, by tier",
            ["tier"],
            buckets=_DELAY_BUCKETS,
            registry=r,
        )
        self.jct = Histogram(
            "arbiter_job_completion_seconds",
            "Submission to completion, by tier",
            ["tier"],
            buckets=_DELAY_BUCKETS,
            registry=r,
        )
        self.lost_gpu_hours = Counter(
            "arbiter_lost_gpu_hours", "GPU-hours whose work was lost to failures", registry=r
        )
        self.breaker_trips = Counter(
            "arbiter_breaker_trips",
            "Circuit breaker trips of live jobs, by breaker and action (stop, flag)",
            ["breaker", "action"],
            registry=r,
        )
        self.breaker_saved_gpu_hours = Counter(
            "arbiter_breaker_saved_gpu_hours",
            "GPU-hours a job stopped by a breaker would still have held (to its walltime)",
            registry=r,
        )
        self.stragglers = Counter(
            "arbiter_straggler_nodes",
            "Nodes marked degraded because their ranks held a gang back",
            registry=r,
        )
        self.webhooks = Counter(
            "arbiter_webhook_messages", "Team webhook messages by outcome", ["outcome"], registry=r
        )
        t = self.team_registry = CollectorRegistry()
        self.spent = Gauge(
            "arbiter_team_credits_spent", "Credits charged less refunds", ["team"], registry=t
        )
        self.burn = Gauge(
            "arbiter_team_burn_rate", "Credits per hour of running jobs", ["team"], registry=t
        )
        self.cycle = Histogram(
            "arbiter_cycle_seconds", "Scheduling cycle time", buckets=_FAST_BUCKETS, registry=r
        )
        self.batch = Histogram(
            "arbiter_commit_batch_size",
            "Requests committed per transaction",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500),
            registry=r,
        )
        self.api = Histogram(
            "arbiter_api_request_seconds",
            "API latency by route",
            ["method", "route"],
            buckets=_FAST_BUCKETS,
            registry=r,
        )

    def set_labelled(self, gauge: Gauge, values: Mapping[tuple[str, ...], float]) -> None:
        """Replace every series of a labelled gauge (series that vanished drop to nothing)."""
        gauge.clear()
        for labels, value in values.items():
            gauge.labels(*labels).set(value)

    def exposition(self, teams: str | None = "*") -> bytes:
        """The cluster-wide series, and the per-team series of every team ("*"), of one team
        (its name) or of none (None)."""
        out = generate_latest(self.registry)
        if teams == "*":
            out += generate_latest(self.team_registry)
        elif teams is not None:
            out += generate_latest(_OneTeam(self.team_registry, teams))
        return out


class _OneTeam:
    """A view of a registry with only the samples labelled `team=<team>`."""

    def __init__(self, registry: CollectorRegistry, team: str) -> None:
        self.registry = registry
        self.team = team

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            mine = Metric(family.name, family.documentation, family.type, family.unit)
            mine.samples = [s for s in family.samples if s.labels.get("team") == self.team]
            yield mine
