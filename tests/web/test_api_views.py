"""The dashboard's JSON views on the seeded live service (no browser needed)."""

from __future__ import annotations

import time

import httpx
import pytest


def test_heatmap_counts_every_gpu_of_the_seeded_cluster_by_state(seeded):
    h = seeded.admin.get("/ui/api/heatmap").json()
    assert h["gpus"] == 40 and h["nodes"] == 5
    assert [r["name"] for r in h["racks"]] == ["rack0", "rack1"]
    c = h["counts"]
    assert c["tier 1"] == 8 and c["borrowed"] == 10 and c["free"] == 6
    assert c["cordoned"] == 8 and c["failed"] == 8
    nodes = {n["name"]: n for r in h["racks"] for n in r["nodes"]}
    assert nodes["n4"]["reason"] == "maintenance: PSU swap"
    assert nodes["n5"]["cells"] == "x" * 8


def test_queue_says_why_each_seeded_job_waits(seeded):
    q = seeded.admin.get("/ui/api/queue").json()
    by_name = {j["name"]: j for j in q["jobs"]}
    assert set(by_name) == set(seeded.pending)
    assert by_name["sweep"]["reason"] == "gang"
    assert by_name["big-eval"]["reason"] == "capacity"
    assert by_name["try-out"]["reason"] == "budget"
    assert by_name["try-out"]["tier"] == 3 and by_name["try-out"]["tier_requested"] == 2


def test_team_token_sees_only_its_own_queue_and_spend(seeded):
    with httpx.Client(
        base_url=seeded.url, headers={"Authorization": f"Bearer {seeded.tokens['research']}"}
    ) as c:
        q = c.get("/ui/api/queue").json()
        assert {j["team"] for j in q["jobs"]} == {"research"}
        assert q["other_teams"] == 2
        assert [t["team"] for t in c.get("/ui/api/teams").json()["teams"]] == ["research"]
        jobs = [
            j
            for r in c.get("/ui/api/heatmap").json()["racks"]
            for n in r["nodes"]
            for j in n["jobs"]
        ]
        assert {j["team"] for j in jobs} == {"research", "other"}


def test_teams_show_the_burn_rate_and_accrued_spend_of_the_seeded_jobs(seeded):
    teams = {t["team"]: t for t in seeded.admin.get("/ui/api/teams").json()["teams"]}
    assert {name: t["burn_rate"] for name, t in teams.items()} == seeded.burn
    vision = teams["vision"]
    assert vision["budget"] == 1000 and 0 < vision["spent_period"] < 1
    assert vision["cost_per_useful_gpu_hour"] == pytest.approx(3.5)  # nothing lost yet
    assert teams["interns"]["remaining"] == 0 and teams["interns"]["spent_period"] == 0


def test_timeline_shows_utilisation_and_the_failure_and_cordon_events(seeded):
    # Wait until the seeded jobs have run through at least one whole one-second bin.
    deadline = time.monotonic() + 15
    while True:
        tl = seeded.admin.get("/ui/api/timeline", params={"window": 60}).json()
        if max(tl["utilisation"]) >= 18 / 24 - 1e-6 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(tl["t"]) == len(tl["utilisation"]) == len(tl["goodput"]) == 60
    assert max(tl["utilisation"]) == pytest.approx(18 / 24)  # of the GPUs in service
    assert max(tl["goodput"]) == pytest.approx(18 / 24)  # nothing lost to failures yet
    kinds = {(e["kind"], e["subject"]) for e in tl["events"]}
    assert {("failure", "n5"), ("cordon", "n4")} <= kinds


def test_dashboard_views_need_a_token(seeded):
    assert httpx.get(f"{seeded.url}/ui/api/heatmap").status_code == 401
    assert httpx.get(f"{seeded.url}/").status_code == 200
