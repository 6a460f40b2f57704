"""What the dashboard reads from the running engine, copied into plain data in one go.

The engine belongs to the control loop's thread, so the copy is taken there (`take`, run as a
loop command between batches) and everything the views compute afterwards works on these frozen
values from any thread. Only plain numbers and strings are copied: a few thousand small tuples
for a 10,000-GPU cluster, so taking it costs the loop about a millisecond.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpu_arbiter.control.loop import ControlLoop
from gpu_arbiter.domain import MILLI, Cluster
from gpu_arbiter.economy import is_preemptible
from gpu_arbiter.engine.capacity import POWER_FACTOR


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node: `free_mask` has bit g set when GPU g is free (always 0 for a node that is out
    of service); `state` is the control plane's: up, down (failed), cordoned or degraded
    (its ranks held a gang back: its jobs run on, it takes no new work)."""

    name: str
    rack: str
    gpu_type: str
    gpus: int
    domain: int
    state: str
    reason: str
    free_mask: int


@dataclass(frozen=True, slots=True)
class Holding:
    """GPUs of one node that one running job holds."""

    job_id: str
    team: str
    tier: int
    borrowed: bool
    preempting: bool
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A job in the queue. `gpus` is the smallest size it may start at; `reason` and `why` are
    the engine's record of why it waits (`engine.waiting`: a code and a sentence)."""

    id: str
    team: str
    tier: int
    requested_tier: int
    gpus: int
    gpu_types: tuple[str, ...]
    tp: int
    max_racks: int | None
    power_profile: str
    gpu_milli: int
    submitted_at: float
    queued_since: float
    reason: str = "queued"
    why: str = "no scheduling cycle has looked at it yet"


@dataclass(frozen=True, slots=True)
class TeamState:
    """A team as the engine and the budget book see it now. `remaining` is None for a team
    without a budget."""

    name: str
    weight: float
    quota: dict[str, int]
    used: dict[str, float]  # GPUs held per type, fractional jobs at their share
    budget: float | None
    remaining: float | None
    burn_rate: float
    period_start: float
    accrued_credits: float = 0.0  # of run segments still open, since the period began
    accrued_gpu_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class OpenSegment:
    """The part of a running job's segment not charged yet: since when (the loop charges
    running segments as they run, up to `billed_to`), at how many credits an hour, on how many
    GPUs (a fractional job at its share)."""

    team: str
    start: float
    rate: float
    gpus: float

    def credits(self, since: float, now: float) -> float:
        """What the segment has cost from `since` (or its start, if later) to `now`."""
        return self.rate * max(0.0, now - max(self.start, since)) / 3600


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    nodes: tuple[NodeState, ...] = ()
    holdings: dict[str, tuple[Holding, ...]] = field(default_factory=dict)  # by node name
    rack_headroom_w: dict[str, float] = field(default_factory=dict)
    watts_per_gpu: dict[tuple[str, str], float] = field(default_factory=dict)
    pending: tuple[PendingJob, ...] = ()
    teams: tuple[TeamState, ...] = ()
    segments: dict[str, OpenSegment] = field(default_factory=dict)  # by job id


@dataclass(slots=True)
class Copied:
    """The engine's state as the loop thread copies it: flat lists and references to immutable
    objects (the cluster, job specs, allocations) only, so copying a 10,000-GPU cluster takes
    a few milliseconds of the loop's time; `build` turns it into a `Snapshot` off the loop."""

    now: float
    teams: tuple[TeamState, ...]
    segments: dict[str, OpenSegment] = field(default_factory=dict)
    cluster: Cluster | None = None
    free_mask: list[int] = field(default_factory=list)
    down: list[bool] = field(default_factory=list)
    out_of_service: dict[str, tuple[str, str]] = field(default_factory=dict)  # state, reason
    running: list[tuple] = field(default_factory=list)
    pending: list[tuple] = field(default_factory=list)
    headroom: dict[str, float] = field(default_factory=dict)
    watts: dict[tuple[str, str], float] = field(default_factory=dict)


def copy(loop: ControlLoop, now: float) -> Copied:
    """Copy what the dashboard needs; call only on the loop thread (see the module docstring)."""
    segments = _open_segments(loop)
    teams = _teams(loop, now, segments)
    sched = loop.state.sched
    if sched is None:
        return Copied(now, teams, segments)
    index = sched.index
    running = [
        (j.id, j.team, int(j.tier), j.borrowed, j.preempting, j.allocation.slots)
        for j in sched.running.values()
        if j.allocation is not None
    ]
    why = sched.waiting_reasons()
    pending = []
    for job in [*sched.queue.jobs(), *(h.job for h in sched.holds.values())]:
        types = tuple(sched.types_by_speed(job))
        live = loop.state.live.get(job.id)
        submitted = live.submitted_at if live is not None else job.spec.submit_s
        pending.append((job.spec, int(job.tier), job.queued_since, types, why[job.id], submitted))
    return Copied(
        now=now,
        teams=teams,
        segments=segments,
        cluster=sched.cluster,
        free_mask=list(index.free_mask),
        down=list(index.down),
        out_of_service={
            name: (row["state"], row.get("reason", ""))
            for name, row in loop.state.nodes.items()
            if row["state"] != "up"
        },
        running=running,
        pending=pending,
        headroom={name: index.power_headroom(i) for i, name in enumerate(index.rack_names)},
        watts={(t, p): index.watts_per_gpu(t, p) for t in index.max_size for p in POWER_FACTOR},
    )


def build(c: Copied) -> Snapshot:
    """The snapshot of a copy; safe on any thread."""
    if c.cluster is None:
        return Snapshot(now=c.now, teams=c.teams, segments=c.segments)
    nodes = []
    for n in c.cluster.nodes:
        state, reason = "up", ""
        if c.down[n.index]:
            state, reason = c.out_of_service.get(n.name, ("down", ""))
            state = state if state in ("cordoned", "degraded") else "down"
        nodes.append(
            NodeState(
                n.name, n.rack, n.gpu_type, n.gpus, n.domain_size, state, reason,
                c.free_mask[n.index],
            )
        )  # fmt: skip
    holdings: dict[str, list[Holding]] = {}
    for job_id, team, tier, borrowed, preempting, slots in c.running:
        for node, gpus in slots:
            holdings.setdefault(c.cluster.nodes[node].name, []).append(
                Holding(job_id, team, tier, borrowed, preempting, gpus)
            )
    pending = tuple(
        PendingJob(
            id=spec.id,
            team=spec.team,
            tier=tier,
            requested_tier=int(spec.tier),
            gpus=spec.elastic_range[0],
            gpu_types=types,
            tp=spec.tp_size,
            max_racks=spec.max_racks,
            power_profile=spec.power_profile,
            gpu_milli=spec.gpu_milli,
            submitted_at=submitted,
            queued_since=queued_since,
            reason=waiting.code,
            why=waiting.text,
        )
        for spec, tier, queued_since, types, waiting, submitted in c.pending
    )
    return Snapshot(
        now=c.now,
        nodes=tuple(nodes),
        holdings={k: tuple(v) for k, v in holdings.items()},
        rack_headroom_w=c.headroom,
        watts_per_gpu=c.watts,
        pending=pending,
        teams=c.teams,
        segments=c.segments,
    )


def take(loop: ControlLoop, now: float) -> Snapshot:
    """Copy and build in one go (on the loop thread)."""
    return build(copy(loop, now))


def _open_segments(loop: ControlLoop) -> dict[str, OpenSegment]:
    """Each running job's segment as far as it is not charged yet, priced as its charge will
    be; what the loop already charged is in the ledger."""
    out = {}
    for job_id, seg in loop.accounts.segs.items():
        live = loop.state.live.get(job_id)
        if live is None:
            continue
        rate = loop.accounts.charges.rate(
            live.spec, seg.gpu_type, seg.tier, seg.gpus, is_preemptible(seg.tier, seg.borrowed)
        )
        out[job_id] = OpenSegment(
            live.spec.team, seg.billed_to, rate, seg.gpus * live.spec.gpu_milli / MILLI
        )
    return out


def _teams(
    loop: ControlLoop, now: float, segments: dict[str, OpenSegment]
) -> tuple[TeamState, ...]:
    sched = loop.state.sched
    budgets = loop.accounts.budgets
    start = budgets.period_start(budgets.period_index(now))
    out = []
    accrued: dict[str, list[float]] = {}
    for seg in segments.values():
        acc = accrued.setdefault(seg.team, [0.0, 0.0])
        acc[0] += seg.credits(start, now)
        acc[1] += seg.gpus * max(0.0, now - max(seg.start, start))
    for name, team in sorted(loop.state.teams.items()):
        used: dict[str, float] = {}  # GPUs, a fractional job (S11) counted at its share
        if sched is not None:
            for (t_name, gpu_type), book in sched.team_jobs.items():
                if t_name == name and book.jobs:
                    milli = sum(j.milli_held for j in book.jobs.values())
                    used[gpu_type] = milli / MILLI
        remaining = budgets.remaining(name, now)
        out.append(
            TeamState(
                name=name,
                weight=team.weight,
                quota=dict(team.quota),
                used=used,
                budget=team.budget_per_period,
                remaining=None if math.isinf(remaining) else remaining,
                burn_rate=loop.accounts.burn.get(name, 0.0),
                period_start=start,
                accrued_credits=accrued.get(name, [0.0, 0.0])[0],
                accrued_gpu_seconds=accrued.get(name, [0.0, 0.0])[1],
            )
        )
    return tuple(out)
