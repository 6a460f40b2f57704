"""The dashboard's JSON views: pure functions from a snapshot (and rows read from the database)
to what the page draws. No I/O here, so each view is unit-tested on hand-made inputs.

A viewer with a team token sees the whole heat map (occupancy is not a secret) but other teams'
jobs there only as "other", and only its own jobs and spend in the queue and team tables and its
own jobs' events on the timeline.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_arbiter.economy.chargeback import RUN
from gpu_arbiter.metrics import Segment, timeline
from gpu_arbiter.web.snapshot import Snapshot

# One character per GPU in the heat map, so 10,000 GPUs are 10,000 bytes of JSON.
CELLS = {
    "0": "free",
    "1": "tier 1",
    "2": "tier 2",
    "3": "tier 3",
    "b": "borrowed",
    "h": "held for a job",
    "x": "failed",
    "c": "cordoned",
}
EVENT_ACTIONS = {
    "preempt": "preemption",
    "node-down": "failure",
    "failed": "failure",
    "node-cordoned": "cordon",
    "node-degraded": "cordon",  # out of placement: its ranks held a gang back
    "node-up": "recovery",
}
QUEUE_LIMIT = 500


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who looks: an admin sees everything, a team its own jobs and bill."""

    role: str
    team: str | None

    def sees(self, team: str) -> bool:
        return self.role == "admin" or self.team == team


def heatmap_view(snap: Snapshot, viewer: Viewer) -> dict[str, Any]:
    """Every GPU by rack and node, one cell character each (see `CELLS`). `counts` counts the
    cells; `by_tier` counts the GPUs held at each tier, borrowed ones included (a borrowed
    cell shows that it is borrowed, not its tier)."""
    racks: dict[str, list[dict[str, Any]]] = {}
    counts = dict.fromkeys(CELLS.values(), 0)
    by_tier = {"1": 0, "2": 0, "3": 0}
    for node in snap.nodes:
        cells = ["0"] * node.gpus
        tiers = [""] * node.gpus
        runs = node.state in ("up", "degraded")  # a degraded node runs its jobs, takes no new
        if not runs:
            cells = ["x" if node.state == "down" else "c"] * node.gpus
        else:
            for g in range(node.gpus):
                if not node.free_mask >> g & 1:
                    cells[g] = "h"
        jobs = []
        for h in snap.holdings.get(node.name, ()):
            code = "b" if h.borrowed else str(h.tier)
            for g in h.gpus:
                if runs and (cells[g] in "0h" or code < cells[g]):
                    cells[g] = code
                    tiers[g] = str(h.tier)
            mine = viewer.sees(h.team)
            jobs.append(
                {
                    "id": h.job_id if mine else "",
                    "team": h.team if mine else "other",
                    "tier": h.tier,
                    "borrowed": h.borrowed,
                    "preempting": h.preempting,
                    "gpus": list(h.gpus),
                }
            )
        if node.state == "degraded":
            cells = ["c" if c in "0h" else c for c in cells]  # its free GPUs are out of service
        for c, tier in zip(cells, tiers, strict=True):
            counts[CELLS[c]] += 1
            if tier:
                by_tier[tier] += 1
        racks.setdefault(node.rack, []).append(
            {
                "name": node.name,
                "gpu_type": node.gpu_type,
                "state": node.state,
                "reason": node.reason,
                "cells": "".join(cells),
                "jobs": jobs,
            }
        )
    total = sum(n.gpus for n in snap.nodes)
    in_service = total - counts["failed"] - counts["cordoned"]
    busy = in_service - counts["free"]
    return {
        "now": snap.now,
        "gpus": total,
        "nodes": len(snap.nodes),
        "utilisation": busy / in_service if in_service else 0.0,
        "counts": counts,
        "by_tier": by_tier,
        "legend": CELLS,
        "racks": [{"name": r, "nodes": ns} for r, ns in sorted(racks.items())],
    }


def queue_view(
    snap: Snapshot,
    viewer: Viewer,
    rows: Mapping[str, Mapping[str, Any]],
    limit: int = QUEUE_LIMIT,
) -> dict[str, Any]:
    """Queued jobs in tier, then age order, with why each waits. `rows` are the jobs' database
    rows by id (for the name, the last note the control plane left and the preemption count)."""
    order = sorted(snap.pending, key=lambda j: (j.tier, j.queued_since, j.id))
    jobs = []
    hidden = 0
    by_reason: dict[str, int] = {}
    for pos, job in enumerate(order, start=1):
        by_reason[job.reason] = by_reason.get(job.reason, 0) + 1
        if not viewer.sees(job.team):
            hidden += 1
            continue
        if len(jobs) >= limit:
            continue
        row = rows.get(job.id, {})
        jobs.append(
            {
                "position": pos,
                "id": job.id,
                "name": row.get("name", ""),
                "team": job.team,
                "tier": job.tier,
                "tier_requested": job.requested_tier,
                "gpus": job.gpus,
                "gpu_types": list(job.gpu_types),
                "wait_s": max(0.0, snap.now - job.submitted_at),
                "queued_s": max(0.0, snap.now - job.queued_since),
                "reason": job.reason,
                "why": job.why,
                "note": row.get("reason", ""),
                "preemptions": row.get("preemptions", 0),
            }
        )
    return {
        "now": snap.now,
        "pending": len(order),
        "shown": len(jobs),
        "other_teams": hidden,
        "by_reason": by_reason,
        "jobs": jobs,
    }


@dataclass(frozen=True, slots=True)
class PeriodSpend:
    """One team's ledger since the budget period began: net credits spent, GPU-seconds held and
    GPU-seconds that were not lost to failures (see `period_spend`)."""

    credits: float = 0.0
    gpu_seconds: float = 0.0
    useful_gpu_seconds: float = 0.0


def period_spend(entries: Iterable[Mapping[str, Any]]) -> dict[str, PeriodSpend]:
    """Fold ledger entries, or their sums by team, kind and reason (`control.bills.spend_since`),
    into spend per team. A charge for lost work or a re-run held GPUs without producing kept
    progress, so only "run" charges count as useful."""
    acc: dict[str, list[float]] = {}
    for e in entries:
        a = acc.setdefault(e["team"], [0.0, 0.0, 0.0])
        if e["kind"] == "charge":
            a[0] += e["credits"]
            a[1] += e.get("gpu_seconds", 0.0)
            if e.get("reason") == RUN:
                a[2] += e.get("gpu_seconds", 0.0)
        elif e["kind"] == "refund":
            a[0] -= e["credits"]
    return {team: PeriodSpend(*v) for team, v in acc.items()}


def teams_view(
    snap: Snapshot,
    viewer: Viewer,
    spend: Mapping[str, PeriodSpend],
    credit_value: float = 1.0,
    currency: str = "USD",
) -> dict[str, Any]:
    """Per team: what it burns now, what it spent this period against its budget and what a
    useful GPU-hour cost it. Open run segments are counted as accrued so far, so a long job
    shows its cost before it ends."""
    out = []
    for t in snap.teams:
        if not viewer.sees(t.name):
            continue
        s = spend.get(t.name, PeriodSpend())
        spent = s.credits + t.accrued_credits
        useful_h = (s.useful_gpu_seconds + t.accrued_gpu_seconds) / 3600
        per_useful = spent / useful_h if useful_h > 0 else None
        out.append(
            {
                "team": t.name,
                "weight": t.weight,
                "quota": t.quota,
                "gpus_used": t.used,
                "burn_rate": t.burn_rate,
                "burn_money": t.burn_rate * credit_value,
                "spent_period": spent,
                "spent_money": spent * credit_value,
                "budget": t.budget,
                "remaining": None if t.remaining is None else t.remaining - t.accrued_credits,
                "budget_used": spent / t.budget if t.budget else None,
                "gpu_hours_period": (s.gpu_seconds + t.accrued_gpu_seconds) / 3600,
                "useful_gpu_hours_period": useful_h,
                "cost_per_useful_gpu_hour": per_useful,
                "period_start": t.period_start,
            }
        )
    return {
        "now": snap.now,
        "currency": currency,
        "credit_value": credit_value,
        "teams": out,
    }


def segments_from_ledger(entries: Iterable[Mapping[str, Any]]) -> list[Segment]:
    """The run segments the ledger charged for; those charged as lost work kept nothing."""
    return [
        Segment.whole(e["start"], e["end"], e["gpus"], e.get("reason") == RUN)
        for e in entries
        if e["kind"] == "charge" and "start" in e
    ]


def timeline_view(
    segments: list[Segment],
    events: Iterable[Mapping[str, Any]],
    gpus: int,
    start: float,
    end: float,
    bins: int = 60,
) -> dict[str, Any]:
    """Utilisation and goodput of `gpus` GPUs in `bins` equal bins over [start, end)
    (`metrics.timeline`, at the bins' centres), plus preemptions and failures (audit rows) as
    events. Utilisation counts GPU time held; goodput counts the part of it not lost to
    failures."""
    binned = timeline(segments, gpus, start, end, bins)
    half = (end - start) / bins / 2
    return {
        "start": start,
        "end": end,
        "gpus": gpus,
        "t": [t + half for t in binned["t"]],
        "utilisation": [min(1.0, x) for x in binned["utilization"]],
        "goodput": [min(1.0, x) for x in binned["goodput"]],
        "events": [
            {
                "at": e["at"],
                "kind": EVENT_ACTIONS[e["action"]],
                "action": e["action"],
                "subject": e["subject"],
                "reason": (e.get("detail") or {}).get("reason", ""),
            }
            for e in events
            if e["action"] in EVENT_ACTIONS and start <= e["at"] <= end
        ],
    }
