"""The dashboard's JSON views on the seeded live service (no browser needed)."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.control.harness import wait_for


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
    def looked_at() -> dict | None:
        # A job no cycle has tried yet is honestly "queued"; wait for the engine's own reason.
        q = seeded.admin.get("/ui/api/queue").json()
        return None if any(j["reason"] == "queued" for j in q["jobs"]) else q

    q = wait_for(looked_at, timeout_s=30)
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
    # The window is cut to the service's seconds of history: bins of a fraction of a second,
    # where the floating-point error of epoch times is a few millionths.
    assert max(tl["utilisation"]) == pytest.approx(18 / 24, rel=1e-4)  # of the GPUs in service
    assert max(tl["goodput"]) == pytest.approx(18 / 24, rel=1e-4)  # nothing lost to failures yet
    kinds = {(e["kind"], e["subject"]) for e in tl["events"]}
    assert {("failure", "n5"), ("cordon", "n4")} <= kinds


def test_the_timeline_starts_with_the_service_and_a_team_sees_its_own_events(seeded):
    research = seeded.server.client(seeded.tokens["research"])
    r = research.post("/v1/jobs", json={"command": "exit 3", "gpus": 1, "tier": 3, "name": "crash"})
    assert r.status_code == 201, r.text
    crash = r.json()["id"]

    def events(client: httpx.Client) -> tuple[dict, set]:
        tl = client.get("/ui/api/timeline", params={"window": 86_400}).json()
        return tl, {(e["kind"], e["subject"]) for e in tl["events"]}

    wait_for(lambda: ("failure", crash) in events(seeded.admin)[1], timeout_s=30)
    tl, admin_sees = events(seeded.admin)
    assert {("failure", "n5"), ("cordon", "n4"), ("failure", crash)} <= admin_sees
    assert events(research)[1] == {("failure", crash)}  # no node events, no other team's
    with seeded.server.client(seeded.tokens["vision"]) as vision:
        assert events(vision)[1] == set()
    first = seeded.admin.get("/v1/audit", params={"limit": 1}).json()[0]["at"]
    assert tl["start"] == pytest.approx(first)  # not a day before the service began
    research.close()


def test_running_jobs_show_where_since_when_and_their_cost_so_far(seeded):
    running = seeded.admin.get("/ui/api/running").json()
    jobs = {j["id"]: j for j in running["jobs"]}
    assert set(jobs) == set(seeded.running.values())
    pretrain = jobs[seeded.running["pretrain"]]
    assert (pretrain["team"], pretrain["tier"], pretrain["gpus"]) == ("vision", 1, 8)
    assert len(pretrain["nodes"]) == 1 and pretrain["gpu_type"] == "H100"
    assert pretrain["rate"] == pytest.approx(seeded.burn["vision"]) and pretrain["cost"] > 0
    explore = jobs[seeded.running["explore-a"]]
    assert explore["borrowed"] and explore["gpus"] == 5
    with seeded.server.client(seeded.tokens["research"]) as research:
        mine = research.get("/ui/api/running").json()
    assert {j["team"] for j in mine["jobs"]} == {"research"} and mine["other_teams"] == 1


def test_a_job_page_has_its_telemetry_checkpoints_events_and_cost(seeded):
    job = seeded.running["pretrain"]
    reports = [
        {"step": 10, "loss": 3.0, "tokens_per_s": 1000.0, "io_wait_share": 0.1},
        {"event": "checkpoint", "checkpoint_step": 10},
        {"step": 20, "loss": 2.5, "tokens_per_s": 1100.0, "io_wait_share": 0.2},
    ]
    for body in reports:
        r = seeded.admin.post(f"/v1/jobs/{job}/telemetry", json=body)
        assert r.status_code == 200, r.text
    page = seeded.admin.get(f"/ui/api/jobs/{job}").json()
    assert page["job"]["id"] == job and page["job"]["team"] == "vision"
    tl = page["telemetry"]
    assert tl["loss"][-2:] == [3.0, 2.5] and tl["io_wait_share"][-2:] == [0.1, 0.2]
    assert [c["step"] for c in page["checkpoints"]][-1:] == [10]
    assert [e["kind"] for e in page["events"]][:2] == ["submitted", "started"]
    assert page["cost"]["rate"] == pytest.approx(seeded.burn["vision"])
    assert page["cost"]["total"] >= page["cost"]["accruing"] > 0
    with seeded.server.client(seeded.tokens["research"]) as research:
        assert research.get(f"/ui/api/jobs/{job}").status_code == 404  # not its job
    assert seeded.admin.get("/ui/api/jobs/j-none").status_code == 404
    assert httpx.get(f"{seeded.url}/jobs/{job}").status_code == 200  # the page's shell


def test_dashboard_views_need_a_token(seeded):
    assert httpx.get(f"{seeded.url}/ui/api/heatmap").status_code == 401
    assert httpx.get(f"{seeded.url}/").status_code == 200
