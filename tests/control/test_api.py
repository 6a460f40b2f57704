"""The REST API against a real server: auth isolation, validation, idempotency, audit."""

from __future__ import annotations

import itertools

import httpx

from tests.control.harness import ADMIN, wait_for

_names = itertools.count()


def requests_audited(live) -> int:
    """Audit entries made for requests, whose actor is a token's role (`Principal.actor`):
    what the control loop and the backend record meanwhile (a job started, placed or ended,
    maybe another test's) is left out, so a check that a refused request wrote nothing does
    not race the loop."""
    audit = live.admin.get("/v1/audit", params={"limit": 100000}).json()
    return sum(1 for e in audit if e["actor"].startswith(("team:", "admin")))


def team(live, quota: int = 0) -> tuple[str, httpx.Client]:
    name = f"t{next(_names)}"
    return name, live.team(name, quota)


def job_body(**kw) -> dict:
    return {"command": "sleep 30", "gpus": 1, **kw}


def test_a_team_sees_and_cancels_only_its_own_jobs(live):
    a_name, a = team(live)
    _, b = team(live)
    mine = a.post("/v1/jobs", json=job_body()).json()
    assert mine["team"] == a_name
    assert b.get(f"/v1/jobs/{mine['id']}").status_code == 404
    assert b.post(f"/v1/jobs/{mine['id']}/cancel").status_code == 404
    assert all(j["team"] != a_name for j in b.get("/v1/jobs").json())
    assert b.get("/v1/jobs", params={"team": a_name}).json() == []
    assert b.post("/v1/jobs", json=job_body(team=a_name)).status_code == 403
    assert [j["id"] for j in a.get("/v1/jobs").json()] == [mine["id"]]
    r = a.post(f"/v1/jobs/{mine['id']}/cancel")
    assert r.status_code == 200 and r.json()["state"] == "cancelled"


def test_quotas_prices_nodes_and_tokens_are_admin_only(live):
    _, a = team(live)
    assert a.put("/v1/teams/x", json={"quota": {"H100": 1}}).status_code == 403
    assert a.put("/v1/prices", json={}).status_code == 403
    assert a.put("/v1/nodes/evil", json={"gpu_type": "H100", "gpus": 8}).status_code == 403
    assert a.post("/v1/nodes/n1/cordon").status_code == 403
    assert a.post("/v1/tokens", json={"team": "x"}).status_code == 403
    assert a.get("/v1/audit").status_code == 403
    assert httpx.get(f"{live.server.url}/v1/jobs").status_code == 401
    bad = httpx.get(f"{live.server.url}/v1/jobs", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401


def test_a_bad_request_names_the_field_and_changes_nothing(live):
    _, a = team(live)
    before = len(live.admin.get("/v1/jobs", params={"limit": 10000}).json())
    audit_before = requests_audited(live)
    for body, field in (
        (job_body(gpus="many"), "gpus"),
        (job_body(tier=7), "tier"),
        (job_body(colour="red"), "colour"),
        ({"gpus": 1}, "command"),
        (job_body(env={"CUDA_VISIBLE_DEVICES": "3"}), "env"),
    ):
        r = a.post("/v1/jobs", json=body)
        assert r.status_code == 422, r.text
        assert field in r.json()["detail"]
    too_big = a.post("/v1/jobs", json=job_body(gpus=64))
    assert too_big.status_code == 422 and "64 GPUs" in too_big.json()["detail"]
    r = live.admin.put("/v1/teams/greedy", json={"quota": {"H100": 99}})
    assert r.status_code == 422 and "quotas promise" in r.json()["detail"]
    assert live.admin.put("/v1/prices", json={"on_demand": {"1": -1}}).status_code == 422
    assert len(live.admin.get("/v1/jobs", params={"limit": 10000}).json()) == before
    assert requests_audited(live) == audit_before


def test_a_bad_submission_is_refused_before_it_reaches_the_loop(live):
    """The submit route reads its own headers and body (the API's hot path): the same checks,
    the same 4xx naming what is wrong, nothing written."""
    _, a = team(live)
    audit_before = requests_audited(live)
    long_key = a.post("/v1/jobs", json=job_body(), headers={"Idempotency-Key": "k" * 129})
    assert long_key.status_code == 422 and "idempotency-key" in long_key.json()["detail"]
    not_json = a.post(
        "/v1/jobs", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert not_json.status_code == 422 and not_json.json()["detail"].startswith("body")
    nested = a.post("/v1/jobs", json=job_body(gpu_types={"H100": -1}))
    assert nested.status_code == 422 and "body.gpu_types" in nested.json()["detail"]
    url = f"{live.server.url}/v1/jobs"
    assert httpx.post(url, json=job_body()).status_code == 401
    basic = httpx.post(url, json=job_body(), headers={"Authorization": "Basic eDp5"})
    assert basic.status_code == 401
    unknown = httpx.post(url, json=job_body(), headers={"Authorization": "Bearer nope"})
    assert unknown.status_code == 401 and "unknown" in unknown.json()["detail"]
    assert live.admin.post("/v1/jobs", json=job_body()).status_code == 422  # no team named
    assert requests_audited(live) == audit_before


def test_an_inference_service_states_its_latency_slo_and_a_training_job_cannot(live):
    _, a = team(live)
    served = a.post("/v1/jobs", json=job_body(kind="inference", latency_slo_ms=50, tier=2))
    assert served.status_code == 201, served.text
    view = a.get(f"/v1/jobs/{served.json()['id']}").json()
    assert view["kind"] == "inference" and view["latency_slo_ms"] == 50.0
    audit_before = requests_audited(live)
    trained = a.post("/v1/jobs", json=job_body(latency_slo_ms=50))
    assert trained.status_code == 422 and "latency_slo_ms" in trained.json()["detail"]
    zero = a.post("/v1/jobs", json=job_body(kind="inference", latency_slo_ms=0))
    assert zero.status_code == 422 and "latency_slo_ms" in zero.json()["detail"]
    assert requests_audited(live) == audit_before
    a.post(f"/v1/jobs/{served.json()['id']}/cancel")


def test_resubmitting_with_the_same_idempotency_key_returns_the_same_job(live):
    _, a = team(live)
    first = a.post("/v1/jobs", json=job_body(), headers={"Idempotency-Key": "k1"})
    again = a.post("/v1/jobs", json=job_body(), headers={"Idempotency-Key": "k1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    by_field = [a.post("/v1/jobs", json=job_body(client_key="k2")).json()["id"] for _ in range(3)]
    assert len(set(by_field)) == 1 and by_field[0] != first.json()["id"]
    clash = a.post("/v1/jobs", json=job_body(gpus=2), headers={"Idempotency-Key": "k1"})
    assert clash.status_code == 409 and "k1" in clash.json()["detail"]
    _, b = team(live)
    other_team = b.post("/v1/jobs", json=job_body(), headers={"Idempotency-Key": "k1"})
    assert other_team.status_code == 201 and other_team.json()["id"] != first.json()["id"]
    for j in [first.json()["id"], by_field[0]]:
        a.post(f"/v1/jobs/{j}/cancel")
    b.post(f"/v1/jobs/{other_team.json()['id']}/cancel")


def test_a_job_runs_with_its_gpus_and_its_segment_is_charged(live):
    _, a = team(live)
    job = a.post("/v1/jobs", json=job_body(command="echo gpus=$CUDA_VISIBLE_DEVICES", gpus=2))
    job_id = job.json()["id"]
    done = wait_for(lambda: (j := a.get(f"/v1/jobs/{job_id}").json())["state"] == "completed" and j)
    assert done["exit_code"] == 0
    log = a.get(f"/v1/jobs/{job_id}/log").text
    assert log.startswith("gpus=") and len(log.strip().split("=")[1].split(",")) == 2
    entries = a.get("/v1/ledger", params={"job": job_id}).json()
    assert [e["reason"] for e in entries] == ["run"]
    assert entries[0]["gpus"] == 2 and entries[0]["credits"] > 0
    assert sum(p[1] for e in entries for p in e["postings"]) == 0


def test_a_failing_job_is_marked_failed_with_its_exit_code(live):
    _, a = team(live)
    job_id = a.post("/v1/jobs", json=job_body(command="exit 3")).json()["id"]
    done = wait_for(lambda: (j := a.get(f"/v1/jobs/{job_id}").json())["state"] == "failed" and j)
    assert done["exit_code"] == 3 and "code 3" in done["reason"]


def test_a_tier1_job_preempts_tier3_jobs_which_requeue(live):
    _, research = team(live, quota=0)
    _, core = team(live, quota=4)
    low = [research.post("/v1/jobs", json=job_body(gpus=4)).json()["id"] for _ in range(2)]
    wait_for(lambda: all(live.job(j)["state"] == "running" for j in low))
    top = core.post("/v1/jobs", json=job_body(gpus=4, tier=1)).json()["id"]
    wait_for(lambda: live.job(top)["state"] == "running")
    states = sorted(live.job(j)["state"] for j in low)
    assert states == ["pending", "running"]
    victim = next(j for j in low if live.job(j)["state"] == "pending")
    assert live.job(victim)["preemptions"] == 1 and f"job {top}" in live.job(victim)["reason"]
    actions = [e["action"] for e in live.admin.get("/v1/audit").json() if e["subject"] == victim]
    assert actions[:3] == ["submit", "start", "preempt"]
    for j in [*low, top]:
        live.admin.post(f"/v1/jobs/{j}/cancel")


def test_every_state_change_is_in_the_audit_log(live):
    name, a = team(live)
    job_id = a.post("/v1/jobs", json=job_body(command="true")).json()["id"]
    wait_for(lambda: live.job(job_id)["state"] == "completed")
    audit = live.admin.get("/v1/audit", params={"limit": 100000}).json()
    assert {"team-set", "token-create", "node-register"} <= {e["action"] for e in audit}
    mine = [e for e in audit if e["subject"] == job_id]
    assert [e["action"] for e in mine] == ["submit", "start", "completed"]
    assert mine[0]["actor"] == f"team:{name}"


def test_a_revoked_token_stops_working_at_once(live):
    _, a = team(live)
    assert a.get("/v1/jobs").status_code == 200
    me = a.get("/v1/whoami").json()
    assert a.post("/v1/jobs", json=job_body(command="true")).status_code == 201
    assert live.admin.delete(f"/v1/tokens/{me['token_id']}").status_code == 200
    assert a.get("/v1/jobs").status_code == 401
    assert a.post("/v1/jobs", json=job_body(command="true")).status_code == 401


def test_openapi_and_metrics_are_published(live):
    spec = httpx.get(f"{live.server.url}/openapi.json").json()
    assert "/v1/jobs" in spec["paths"] and "/v1/nodes/{name}/heartbeat" in spec["paths"]
    submit = spec["paths"]["/v1/jobs"]["post"]
    body = submit["requestBody"]["content"]["application/json"]["schema"]
    assert {"command", "gpus", "tier", "client_key"} <= set(body["properties"])
    assert "idempotency-key" in {p["name"] for p in submit["parameters"]}
    text = httpx.get(f"{live.server.url}/metrics").text
    for name in (
        "arbiter_gpus",
        "arbiter_gpu_utilisation",
        "arbiter_queue_delay_seconds",
        "arbiter_preemptions_total",
        "arbiter_api_request_seconds",
    ):
        assert name in text
    assert 'arbiter_api_request_seconds_count{method="POST",route="/v1/jobs"}' in text
    assert ADMIN not in text
