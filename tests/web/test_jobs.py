"""The running-jobs list and the job page, on hand-made rows."""

from __future__ import annotations

import pytest

from gpu_arbiter.web.jobs import job_page_view, net_credits, running_view
from gpu_arbiter.web.snapshot import OpenSegment, Snapshot
from gpu_arbiter.web.views import Viewer

ADMIN = Viewer("admin", None)
# j1 has run since t=1000 at 36 credits/h, after an earlier segment charged 10 (2 refunded).
SNAP = Snapshot(now=1100.0, segments={"j1": OpenSegment("a", 1000.0, 36.0, 8.0)})
LEDGER = [
    {"kind": "charge", "job_id": "j1", "team": "a", "at": 900.0, "credits": 10.0,
     "reason": "run", "gpu_seconds": 7200.0},
    {"kind": "refund", "job_id": "j1", "team": "a", "at": 950.0, "credits": 2.0,
     "reason": "failure"},
    {"kind": "charge", "job_id": "j2", "team": "b", "at": 900.0, "credits": 5.0, "reason": "run"},
    {"kind": "grant", "team": "a", "at": 0.0, "credits": 100.0, "reason": "budget"},
]  # fmt: skip


def row(id: str, team: str, started_at: float, tier: int = 1) -> dict:
    return {
        "id": id,
        "name": f"{id}-name",
        "team": team,
        "tier": tier,
        "spec": {"tier": tier},
        "allocation": {"gpu_type": "H100", "nodes": {"n2": [0, 1], "n1": [0]}},
        "started_at": started_at,
        "seg_gpus": 3,
        "seg_borrowed": tier == 3,
        "preempting": False,
    }


def test_net_credits_are_charges_less_refunds_per_job():
    assert net_credits(LEDGER) == {"j1": 8.0, "j2": 5.0}


def test_running_jobs_longest_first_with_cost_so_far():
    rows = [row("j2", "b", 1050.0, tier=3), row("j1", "a", 1000.0)]
    v = running_view(SNAP, ADMIN, rows, net_credits(LEDGER))
    assert [j["id"] for j in v["jobs"]] == ["j1", "j2"]
    j1 = v["jobs"][0]
    assert j1["nodes"] == ["n1", "n2"] and j1["gpus"] == 3 and j1["gpu_type"] == "H100"
    assert j1["since"] == 1000.0 and j1["running_s"] == 100.0
    assert j1["cost"] == pytest.approx(8.0 + 36.0 * 100 / 3600)  # ledger + open segment
    assert v["jobs"][1]["borrowed"] and v["jobs"][1]["cost"] == 5.0


def test_a_team_sees_only_its_own_running_jobs():
    rows = [row("j2", "b", 1050.0), row("j1", "a", 1000.0)]
    v = running_view(SNAP, Viewer("team", "b"), rows, {})
    assert [j["id"] for j in v["jobs"]] == ["j2"]
    assert v["running"] == 2 and v["other_teams"] == 1


def test_job_page_has_curves_checkpoints_events_and_cost():
    telemetry = [
        {"at": 1010.0, "data": {"step": 10, "loss": 2.5, "tokens_per_s": 900.0}},
        {"at": 1020.0, "data": {"event": "checkpoint", "checkpoint_step": 10,
                                "checkpoint_at": 1019.0}},
        {"at": 1030.0, "data": {"step": 20, "loss": 2.1, "io_wait_share": 0.25}},
    ]  # fmt: skip
    audit = [
        {"at": 900.0, "actor": "scheduler", "action": "start", "detail": {}},
        {"at": 950.0, "actor": "scheduler", "action": "preempt", "detail": {"reason": "tier 1"}},
        {"at": 960.0, "actor": "scheduler", "action": "requeue", "detail": {"reason": "node down"}},
        {"at": 990.0, "actor": "breakers", "action": "breaker-pause", "detail": {"reason": "NaN"}},
        {"at": 995.0, "actor": "scheduler", "action": "placed", "detail": {}},
        {"at": 999.0, "actor": "scheduler", "action": "failed", "detail": {"reason": "exit 1"}},
    ]
    job = {"id": "j1", "team": "a", "state": "running"}
    ledger = [e for e in LEDGER if e.get("job_id") == "j1"]
    v = job_page_view(job, telemetry, audit, ledger, SNAP)
    t = v["telemetry"]
    assert t["t"] == [1010.0, 1030.0] and t["step"] == [10, 20]
    assert t["loss"] == [2.5, 2.1]
    assert t["tokens_per_s"] == [900.0, None] and t["io_wait_share"] == [None, 0.25]
    assert v["checkpoints"] == [{"at": 1019.0, "step": 10}]
    kinds = [e["kind"] for e in v["events"]]
    assert kinds == ["started", "preemption", "requeued", "breaker trip", "failure"]
    assert v["counts"] == {"preemptions": 1, "failures": 1, "breaker_trips": 1, "checkpoints": 1}
    cost = v["cost"]
    assert cost["charged"] == 8.0 and cost["accruing"] == pytest.approx(1.0)
    assert cost["total"] == pytest.approx(9.0) and cost["rate"] == 36.0
    assert [(e["kind"], e["credits"]) for e in cost["entries"]] == [("charge", 10), ("refund", 2)]
    assert cost["entries"][0]["gpu_hours"] == 2.0
