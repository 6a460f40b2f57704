"""The dashboard's JSON views from hand-made snapshots and ledger rows."""

from __future__ import annotations

import pytest

from gpu_arbiter.metrics import Segment
from gpu_arbiter.web.snapshot import Holding, NodeState, PendingJob, Snapshot, TeamState
from gpu_arbiter.web.views import (
    PeriodSpend,
    Viewer,
    heatmap_view,
    period_spend,
    queue_view,
    segments_from_ledger,
    teams_view,
    timeline_view,
)
from tests.web.clusters import big_cluster

ADMIN = Viewer("admin", None)


def cluster() -> Snapshot:
    nodes = (
        NodeState("n1", "r0", "H100", 4, 4, "up", "", 0b1000),
        NodeState("n2", "r1", "H100", 4, 4, "down", "ECC", 0),
        NodeState("n3", "r1", "H100", 4, 4, "cordoned", "swap", 0),
        NodeState("n4", "r1", "H100", 4, 4, "up", "", 0b0011),
    )
    holdings = {
        "n1": (
            Holding("j1", "a", 1, False, False, (0, 1)),
            Holding("j2", "b", 3, True, False, (2,)),
        ),
    }
    teams = (
        TeamState("a", 2.0, {"H100": 4}, {"H100": 2}, 100.0, 60.0, 7.0, 0.0, 5.0, 3600.0),
        TeamState("b", 1.0, {}, {"H100": 1}, None, None, 0.8, 0.0),
    )
    row = ("H100",), 1, None, "normal", 1000
    pending = (
        PendingJob("j9", "b", 3, 3, 4, *row, 50.0, 90.0, "capacity", "needs 4 H100, 3 free"),
        PendingJob("j8", "a", 2, 2, 3, *row, 20.0, 20.0, "gang", "needs 3 on one node"),
    )
    return Snapshot(
        now=100.0,
        nodes=nodes,
        holdings=holdings,
        rack_headroom_w={"r0": 1e9, "r1": 1e9},
        watts_per_gpu={("H100", "normal"): 560.0},
        pending=pending,
        teams=teams,
    )


def test_heatmap_gives_each_gpu_its_state_by_rack_and_node():
    h = heatmap_view(cluster(), ADMIN)
    cells = {n["name"]: n["cells"] for r in h["racks"] for n in r["nodes"]}
    # n4: GPUs 2 and 3 are taken but no running job holds them: held for a pending job.
    assert cells == {"n1": "11b0", "n2": "xxxx", "n3": "cccc", "n4": "00hh"}
    assert [r["name"] for r in h["racks"]] == ["r0", "r1"]
    assert h["gpus"] == 16 and h["counts"]["free"] == 3 and h["counts"]["failed"] == 4
    assert h["utilisation"] == pytest.approx(5 / 8)


def test_heatmap_counts_by_tier_include_borrowed_gpus():
    h = heatmap_view(cluster(), ADMIN)
    assert h["counts"]["borrowed"] == 1 and h["counts"]["tier 3"] == 0  # the cell says borrowed
    assert h["by_tier"] == {"1": 2, "2": 0, "3": 1}  # j2 is tier 3 work, borrowed or not


def test_a_degraded_node_shows_its_running_jobs_and_no_free_gpus():
    snap = cluster()
    nodes = (*snap.nodes, NodeState("n5", "r1", "H100", 4, 4, "degraded", "straggler", 0))
    holdings = {**snap.holdings, "n5": (Holding("j3", "a", 2, False, False, (1, 2)),)}
    h = heatmap_view(Snapshot(now=snap.now, nodes=nodes, holdings=holdings), ADMIN)
    n5 = next(n for r in h["racks"] for n in r["nodes"] if n["name"] == "n5")
    assert (n5["cells"], n5["state"], n5["reason"]) == ("c22c", "degraded", "straggler")


def test_heatmap_hides_other_teams_jobs_from_a_team_viewer():
    h = heatmap_view(cluster(), Viewer("team", "a"))
    jobs = h["racks"][0]["nodes"][0]["jobs"]
    assert [(j["id"], j["team"]) for j in jobs] == [("j1", "a"), ("", "other")]


def test_heatmap_of_ten_thousand_gpus_counts_every_gpu():
    # How long it takes is measured by `make bench` (bench/dashboard_bench.py).
    h = heatmap_view(big_cluster(), ADMIN)
    assert h["gpus"] == 10_240 and sum(h["counts"].values()) == 10_240


def test_queue_is_in_tier_then_age_order_with_wait_times_and_reasons():
    rows = {"j9": {"name": "sweep", "reason": "stopped after preemption", "preemptions": 1}}
    q = queue_view(cluster(), ADMIN, rows)
    assert [j["id"] for j in q["jobs"]] == ["j8", "j9"]
    j9 = q["jobs"][1]
    assert j9["wait_s"] == 50.0 and j9["queued_s"] == 10.0
    assert j9["name"] == "sweep" and j9["note"] == "stopped after preemption"
    assert j9["reason"] == "capacity" and j9["why"] == "needs 4 H100, 3 free"
    assert q["by_reason"] == {"gang": 1, "capacity": 1}


def test_queue_for_a_team_lists_its_jobs_and_counts_the_others():
    q = queue_view(cluster(), Viewer("team", "b"), {})
    assert [j["id"] for j in q["jobs"]] == ["j9"] and q["other_teams"] == 1
    assert q["jobs"][0]["position"] == 2


def test_period_spend_nets_refunds_and_counts_only_kept_work_as_useful():
    entries = [
        {"kind": "charge", "team": "a", "credits": 7.0, "gpu_seconds": 7200.0, "reason": "run"},
        {"kind": "charge", "team": "a", "credits": 3.5, "gpu_seconds": 3600.0,
         "reason": "lost-work"},
        {"kind": "refund", "team": "a", "credits": 3.5},
    ]  # fmt: skip
    assert period_spend(entries) == {"a": PeriodSpend(7.0, 10_800.0, 7200.0)}


def test_teams_add_open_segments_to_spend_and_price_useful_hours():
    spend = {"a": PeriodSpend(10.0, 7200.0, 3600.0)}
    t = teams_view(cluster(), ADMIN, spend, credit_value=2.0, currency="EUR")
    a = t["teams"][0]
    assert a["spent_period"] == 15.0 and a["spent_money"] == 30.0
    assert a["useful_gpu_hours_period"] == 2.0 and a["cost_per_useful_gpu_hour"] == 7.5
    assert a["budget_used"] == 0.15 and a["remaining"] == 55.0
    assert a["burn_rate"] == 7.0 and a["burn_money"] == 14.0
    b = t["teams"][1]
    assert b["budget"] is None and b["cost_per_useful_gpu_hour"] is None
    assert [x["team"] for x in teams_view(cluster(), Viewer("team", "b"), {})["teams"]] == ["b"]


def test_timeline_bins_held_and_useful_gpu_time_and_keeps_failure_events():
    entries = [
        {"kind": "charge", "start": 0.0, "end": 50.0, "gpus": 2, "reason": "run"},
        {"kind": "charge", "start": 50.0, "end": 100.0, "gpus": 2, "reason": "lost-work"},
        {"kind": "refund", "team": "a"},
    ]
    segments = segments_from_ledger(entries) + [Segment.whole(0.0, 100.0, 1)]
    events = [
        {"at": 50.0, "action": "node-down", "subject": "n2", "detail": {"reason": "ECC"}},
        {"at": 60.0, "action": "start", "subject": "j1", "detail": {}},
    ]
    tl = timeline_view(segments, events, gpus=4, start=0.0, end=100.0, bins=4)
    assert tl["utilisation"] == [0.75, 0.75, 0.75, 0.75]
    assert tl["goodput"] == [0.75, 0.75, 0.25, 0.25]
    assert tl["t"] == [12.5, 37.5, 62.5, 87.5]  # bin centres
    assert [(e["kind"], e["subject"], e["reason"]) for e in tl["events"]] == [
        ("failure", "n2", "ECC")
    ]
    # With no node up there is no capacity to share: nothing is busy.
    idle = timeline_view(segments, [], gpus=0, start=0.0, end=100.0, bins=4)
    assert idle["utilisation"] == idle["goodput"] == [0.0] * 4
