"""The dashboard's job views: the running jobs with what each has cost so far, and one job's
page (its telemetry curves, checkpoints, what happened to it and what it cost). Pure functions
of database rows and the snapshot, like `views`; a team sees only its own jobs.

A job's cost so far is what the ledger charged it (less refunds), which includes what the loop
charges running segments as they run, plus the seconds of its segment not charged yet, priced
as their charge will be (`snapshot.OpenSegment`); so the number grows while the job runs and
does not jump when a charge is posted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpu_arbiter.web.snapshot import Snapshot
from gpu_arbiter.web.views import Viewer

# What happened to a job, by the audit action the control loop records.
JOB_EVENTS = {
    "submit": "submitted",
    "start": "started",
    "resize": "resized",
    "preempt": "preemption",
    "requeue": "requeued",
    "failed": "failure",
    "completed": "completed",
    "cancel": "cancelled",
}
BREAKER = "breaker trip"  # any action named breaker-*: a circuit breaker acted on the job
SERIES = ("loss", "tokens_per_s", "io_wait_share")
TELEMETRY_LIMIT = 5000  # the job page draws a job's latest reports, not all of a long run's


def net_credits(entries: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Ledger entries (their JSON) folded into credits per job: charges less refunds."""
    out: dict[str, float] = {}
    for e in entries:
        job = e.get("job_id")
        if job is None or e["kind"] not in ("charge", "refund"):
            continue
        sign = 1.0 if e["kind"] == "charge" else -1.0
        out[job] = out.get(job, 0.0) + sign * e["credits"]
    return out


def running_view(
    snap: Snapshot,
    viewer: Viewer,
    rows: Iterable[Mapping[str, Any]],
    charged: Mapping[str, float],
) -> dict[str, Any]:
    """The running jobs, longest running first: team, tier, GPUs, nodes, since when and cost
    so far. `rows` are the running jobs' database rows, `charged` their ledger credits."""
    jobs = []
    hidden = 0
    for r in sorted(rows, key=lambda r: (r["started_at"] or snap.now, r["id"])):
        if not viewer.sees(r["team"]):
            hidden += 1
            continue
        seg = snap.segments.get(r["id"])
        alloc = r.get("allocation") or {}
        jobs.append(
            {
                "id": r["id"],
                "name": r["name"],
                "team": r["team"],
                "tier": r["tier"],
                "tier_requested": r["spec"]["tier"],
                "borrowed": bool(r.get("seg_borrowed")),
                "preempting": bool(r.get("preempting")),
                "gpus": r.get("seg_gpus") or 0,
                "gpu_type": alloc.get("gpu_type", ""),
                "nodes": sorted(alloc.get("nodes", {})),
                "since": r["started_at"],
                "running_s": max(0.0, snap.now - (r["started_at"] or snap.now)),
                "cost": charged.get(r["id"], 0.0) + (seg.credits(0.0, snap.now) if seg else 0.0),
                "rate": seg.rate if seg else 0.0,
            }
        )
    return {"now": snap.now, "running": len(jobs) + hidden, "other_teams": hidden, "jobs": jobs}


def job_page_view(
    job: Mapping[str, Any],
    telemetry: Iterable[Mapping[str, Any]],
    audit: Iterable[Mapping[str, Any]],
    ledger: Iterable[Mapping[str, Any]],
    snap: Snapshot,
) -> dict[str, Any]:
    """One job: `job` as the API shows it, its telemetry rows (at, data) in time order, its
    audit rows and the JSON of its ledger entries."""
    series: dict[str, list[Any]] = {"t": [], "step": [], **{k: [] for k in SERIES}}
    checkpoints = []
    for row in telemetry:
        data = row["data"]
        if data.get("event") == "checkpoint" or "checkpoint_at" in data:
            checkpoints.append(
                {"at": data.get("checkpoint_at", row["at"]), "step": data.get("checkpoint_step")}
            )
        if any(k in data for k in SERIES):
            series["t"].append(row["at"])
            series["step"].append(data.get("step"))
            for k in SERIES:
                series[k].append(data.get(k))
    events = []
    for row in audit:
        action = row["action"]
        kind = BREAKER if action.startswith("breaker") else JOB_EVENTS.get(action)
        if kind is None:
            continue
        detail = row.get("detail") or {}
        events.append(
            {
                "at": row["at"],
                "kind": kind,
                "action": action,
                "actor": row["actor"],
                "reason": str(detail.get("reason", "")),
            }
        )
    charges = [
        {
            "at": e["at"],
            "kind": e["kind"],
            "reason": e.get("reason", ""),
            "credits": e["credits"],
            "gpu_hours": e.get("gpu_seconds", 0.0) / 3600,
        }
        for e in ledger
        if e["kind"] in ("charge", "refund")
    ]
    seg = snap.segments.get(job["id"])
    open_credits = seg.credits(0.0, snap.now) if seg else 0.0
    charged = net_credits({**e, "job_id": job["id"]} for e in ledger).get(job["id"], 0.0)

    def count(kind: str) -> int:
        return sum(e["kind"] == kind for e in events)

    return {
        "now": snap.now,
        "job": dict(job),
        "telemetry": series,
        "checkpoints": checkpoints,
        "events": events,
        "counts": {
            "preemptions": count("preemption"),
            "failures": count("failure"),
            "breaker_trips": count(BREAKER),
            "checkpoints": len(checkpoints),
        },
        "cost": {
            "charged": charged,
            "accruing": open_credits,
            "total": charged + open_credits,
            "rate": seg.rate if seg else 0.0,
            "entries": charges,
        },
    }
