"""A job as the database keeps it: its row built from a submission, the `JobSpec` read back
from it, the column values of each change of its state, and the view the API shows of it.

Separate from the loop so that each change of state is written the same way whoever makes it
(a decision, a backend event, a command, a rebuild), and so that the API and the dashboard read
jobs as the loop writes them without importing the loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.engine import Connection

from gpu_arbiter.control.errors import NotFound
from gpu_arbiter.control.schemas import JobSubmit
from gpu_arbiter.control.store import JOBS
from gpu_arbiter.domain import (
    GPU_CATALOG,
    Allocation,
    Cluster,
    InvalidInput,
    JobKind,
    JobSpec,
    Tier,
)

ACTIVE = ("pending", "running")
# A live job's real length is unknown until it exits; the engine needs a finite amount of work,
# so it gets one that only matters for backfill when the user gave no walltime.
LIVE_WORK_S = 7 * 86_400.0
# A job that holds no GPUs has no run segment (`accounting.Segment`).
NO_SEGMENT: Mapping[str, Any] = {
    "seg_start": None,
    "seg_gpu_type": None,
    "seg_gpus": None,
    "seg_tier": None,
    "seg_borrowed": False,
}


@dataclass(slots=True)
class LiveJob:
    """What the loop keeps in memory of a job that has not ended."""

    seq: int
    spec: JobSpec
    command: str
    env: dict[str, str]
    submitted_at: float
    tier: int
    last_checkpoint_at: float | None = None


# -- a submission to a row, a row to the engine's JobSpec --------------------------------------


def spec_from_request(job_id: str, team: str, req: JobSubmit, now: float) -> JobSpec:
    return JobSpec(
        id=job_id,
        team=team,
        tier=Tier(req.tier),
        gpus=req.gpus,
        duration_s=LIVE_WORK_S,
        submit_s=now,
        gpu_types=_accepted(req),
        walltime_s=req.walltime_s,
        min_gpus=req.min_gpus,
        max_gpus=req.max_gpus,
        max_racks=req.max_racks,
        tp_size=req.tp_size,
        checkpoint_interval_s=req.checkpoint_interval_s,
        power_profile=req.power_profile,
        gpu_milli=req.gpu_milli,
        kind=JobKind(req.kind),
        latency_slo_ms=req.latency_slo_ms,
        justification=req.justification,
        data_locality=req.data_locality,
        command=req.command,
    )


def _accepted(req: JobSubmit) -> dict[str, float]:
    """Listed types without speeds get the catalog speed."""
    if isinstance(req.gpu_types, list):
        out = {}
        for name in req.gpu_types:
            if name not in GPU_CATALOG:
                raise InvalidInput(f"gpu_types: unknown GPU type {name!r}")
            out[name] = GPU_CATALOG[name].speed
        return out
    return req.accepted_types()


def submitted_row(
    seq: int,
    spec: JobSpec,
    req: JobSubmit,
    tier: int,
    key: str | None,
    request_hash: str,
    now: float,
) -> dict[str, Any]:
    """The row of a job just queued, at the tier admission gave it."""
    return {
        "seq": seq,
        "id": spec.id,
        "team": spec.team,
        "name": req.name,
        "spec": _spec_json(spec),
        "env": dict(req.env),
        "tier": tier,
        "state": "pending",
        "preempting": False,
        "client_key": key,
        "request_hash": request_hash if key is not None else None,
        "submitted_at": now,
        "preemptions": 0,
        "restarts": 0,
        "reason": "",
        "telemetry": {},
        "seg_borrowed": False,
    }


_SPEC_FIELDS = (
    "tier",
    "gpus",
    "duration_s",
    "submit_s",
    "gpu_types",
    "walltime_s",
    "min_gpus",
    "max_gpus",
    "max_racks",
    "tp_size",
    "checkpoint_interval_s",
    "power_profile",
    "gpu_milli",
    "kind",
    "latency_slo_ms",
    "justification",
    "data_locality",
    "command",
)


def _spec_json(spec: JobSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _SPEC_FIELDS:
        value = getattr(spec, name)
        if name == "gpu_types":
            value = dict(value)
        elif name == "tier":
            value = int(value)
        elif name == "kind":
            value = str(value)
        out[name] = value
    return out


def spec_of(row: Mapping[str, Any]) -> JobSpec:
    s = dict(row["spec"])
    return JobSpec(
        id=row["id"],
        team=row["team"],
        tier=Tier(s.pop("tier")),
        kind=JobKind(s.pop("kind")),
        gpu_types=dict(s.pop("gpu_types")),
        **s,
    )


def live_job(row: Mapping[str, Any]) -> LiveJob:
    """What the loop keeps of an active job, from its row (after a restart)."""
    return LiveJob(
        seq=row["seq"],
        spec=spec_of(row),
        command=row["spec"]["command"],
        env=dict(row["env"]),
        submitted_at=row["submitted_at"],
        tier=row["tier"],
        last_checkpoint_at=row["last_checkpoint_at"],
    )


def allocation_of(cluster: Cluster, data: Mapping[str, Any] | None) -> Allocation | None:
    """The engine's allocation from a row's `allocation` (GPU indices by node name); None
    when there is none or a node is no longer in the cluster."""
    if not data:
        return None
    try:
        slots = tuple(
            (cluster.node(name).index, tuple(gpus)) for name, gpus in data["nodes"].items()
        )
    except InvalidInput:
        return None
    return Allocation(data["gpu_type"], slots)


# -- changes of a job's state --------------------------------------------------------------


def set_job(conn: Connection, job_id: str, **values: Any) -> None:
    """Change columns of one job's row."""
    conn.execute(update(JOBS).where(JOBS.c.id == job_id).values(**values))


def requeued(reason: str) -> dict[str, Any]:
    """The columns of a job that holds nothing any more and waits in the queue."""
    return dict(
        state="pending",
        preempting=False,
        allocation=None,
        started_at=None,
        reason=reason,
        **NO_SEGMENT,
    )


def ended(state: str, reason: str, finished_at: float, exit_code: int | None) -> dict[str, Any]:
    """The columns of a job that has ended (completed, failed or cancelled)."""
    return dict(
        state=state,
        preempting=False,
        allocation=None,
        finished_at=finished_at,
        exit_code=exit_code,
        reason=reason,
        **NO_SEGMENT,
    )


# -- reading rows --------------------------------------------------------------------------


def job_row(conn: Connection, job_id: str) -> dict[str, Any]:
    row = conn.execute(select(JOBS).where(JOBS.c.id == job_id)).mappings().first()
    if row is None:
        raise NotFound(f"job {job_id} not found")
    return dict(row)


def job_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """A job as the API shows it."""
    spec = row["spec"]
    state = "preempting" if row["preempting"] and row["state"] == "running" else row["state"]
    alloc = row.get("allocation")
    return {
        "id": row["id"],
        "name": row["name"],
        "team": row["team"],
        "state": state,
        "tier": row["tier"],
        "tier_requested": spec["tier"],
        "gpus": spec["gpus"],
        "gpu_types": sorted(spec["gpu_types"]),
        "kind": spec["kind"],
        "latency_slo_ms": spec.get("latency_slo_ms"),  # rows from before it was stored lack it
        "command": spec["command"],
        "submitted_at": row["submitted_at"],
        "first_start": row.get("first_start"),
        "started_at": row.get("started_at"),
        "finished_at": row.get("finished_at"),
        "allocation": alloc,
        "preemptions": row["preemptions"],
        "restarts": row["restarts"],
        "exit_code": row.get("exit_code"),
        "reason": row["reason"],
        "client_key": row.get("client_key"),
        "telemetry": row.get("telemetry") or {},
    }
