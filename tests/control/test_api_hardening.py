"""The API's edge (issue 46, item 3): token scopes, metrics visibility, bounds on integers,
one name rule, strict types, the error shapes, and the limit on failed authentications."""

from __future__ import annotations

import itertools
from concurrent.futures import Future

import httpx
import pytest

from gpu_arbiter.control.auth import Principal
from gpu_arbiter.control.config import ServerConfig
from gpu_arbiter.control.loop import Command, ControlLoop
from gpu_arbiter.control.schemas import MAX_ID, TeamPut
from gpu_arbiter.control.store import open_database
from tests.control.harness import ADMIN, NoBackend, start_server, wait_for

_names = itertools.count()
TOO_BIG = 2**63  # one past the largest integer SQLite and PostgreSQL store


def new_team(live, quota: int = 0) -> tuple[str, httpx.Client]:
    name = f"h{next(_names)}"
    return name, live.team(name, quota)


def token(live, **body) -> str:
    r = live.admin.post("/v1/tokens", json=body)
    assert r.status_code == 201, r.text
    return r.json()["token"]


def test_an_agent_token_reaches_the_node_endpoints_only(live):
    agent = live.server.client(token(live, role="agent"))
    node = {"gpu_type": "H100", "gpus": 8}
    assert agent.put("/v1/nodes/agent-node", json=node).status_code == 200
    assert agent.post("/v1/nodes/agent-node/heartbeat", json={}).status_code == 200
    assert agent.get("/v1/nodes").status_code == 200
    for path in ("/v1/ledger", "/v1/bill", "/v1/teams", "/v1/jobs", "/v1/whoami", "/v1/prices"):
        r = agent.get(path)
        assert r.status_code == 403 and "node endpoints" in r.json()["detail"], (path, r.text)
    assert agent.get("/ui/api/teams").status_code == 403
    assert agent.post("/v1/jobs", json={"command": "true", "team": "x"}).status_code == 403
    assert live.admin.post("/v1/nodes/agent-node/cordon", json={}).status_code == 200


def test_per_team_metrics_need_a_token_that_may_see_the_team(live):
    a_name, a = new_team(live)
    b_name, b = new_team(live)
    r = a.post("/v1/jobs", json={"command": "true", "gpus": 1})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    wait_for(lambda: live.job(job_id)["state"] == "completed")
    series = f'arbiter_team_credits_spent{{team="{a_name}"}}'
    wait_for(lambda: series in live.admin.get("/metrics").text)
    anonymous = httpx.get(f"{live.server.url}/metrics").text
    assert "arbiter_gpus" in anonymous and "arbiter_team_" not in anonymous
    assert series in a.get("/metrics").text
    theirs = b.get("/metrics").text
    assert series not in theirs and f'team="{a_name}"' not in theirs
    bad = httpx.get(f"{live.server.url}/metrics", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401


def test_integers_past_what_the_database_stores_are_refused_not_a_500(live):
    for path in ("/v1/ledger", "/v1/audit"):
        r = live.admin.get(path, params={"since": TOO_BIG})
        assert r.status_code == 422 and "since" in r.json()["detail"], r.text
        assert live.admin.get(path, params={"since": MAX_ID}).json() == []
    r = live.admin.delete(f"/v1/tokens/{TOO_BIG}")
    assert r.status_code == 422 and "token_id" in r.json()["detail"], r.text
    assert live.admin.delete(f"/v1/tokens/{MAX_ID}").status_code == 404
    r = live.admin.get("/v1/jobs", params={"limt": 10})
    assert r.status_code == 422 and "query.limt" in r.json()["detail"], r.text
    r = live.admin.put("/v1/teams/big", json={"quota": {"H100": TOO_BIG}})
    assert r.status_code == 422 and "quota" in r.json()["detail"]


@pytest.fixture
def loop(tmp_path):
    db = open_database(str(tmp_path / "a.db"))
    loop = ControlLoop(db, NoBackend(), ServerConfig(state_dir=tmp_path))  # type: ignore[arg-type]
    loop.load()
    yield loop
    db.dispose()


def test_a_command_that_fails_in_the_database_fails_alone_not_its_batch(loop):
    """A revoke of a token id the database cannot hold raised out of the batch's transaction
    (before the API bounded it), and every other client's request in the batch failed with
    it. Now the batch is run again command by command: only the bad one fails."""
    admin = Principal("admin", None, 1)
    put = loop.commands.put_team
    batch = [Command(put, (admin, f"team{i}", TeamPut()), Future()) for i in (1, 2)]
    bad = Command(loop.commands.revoke_token, (admin, TOO_BIG), Future())
    batch.insert(1, bad)
    batch.append(Command(loop.commands.put_team, (admin, "team3", TeamPut()), Future()))
    loop.run_batch(batch)
    assert bad.future.exception(timeout=0) is not None  # resolved by `run_batch` itself
    for cmd in batch:
        if cmd is not bad:
            assert cmd.future.result(timeout=0)["name"].startswith("team")
    loop.load()
    assert set(loop.state.teams) == {"team1", "team2", "team3"}


@pytest.mark.parametrize(
    "name",
    ["ctl%01char", "x" * 65, "x'%20OR%201=1--", "-leading-dash", "semi;colon", "%C3%A9t%C3%A9"],
)
def test_one_name_rule_for_teams_as_for_tokens_and_jobs(live, name):
    r = live.admin.put(f"/v1/teams/{name}", json={})
    assert r.status_code == 422 and "name" in r.json()["detail"], r.text
    node = "x" * 129 if name == "x" * 65 else name  # host names may run to 128
    r = live.admin.post(f"/v1/nodes/{node}/heartbeat", json={})
    assert r.status_code == 422 and "name" in r.json()["detail"], r.text


def test_a_team_without_active_jobs_can_be_deleted_and_its_tokens_stop_working(live):
    name, client = new_team(live)
    assert client.get("/v1/jobs").status_code == 200
    _, other = new_team(live)
    assert other.delete(f"/v1/teams/{name}").status_code == 403
    r = live.admin.delete(f"/v1/teams/{name}")
    assert r.status_code == 200 and len(r.json()["tokens_revoked"]) == 1, r.text
    assert client.get("/v1/jobs").status_code == 401
    assert name not in {t["name"] for t in live.admin.get("/v1/teams").json()}
    assert live.admin.delete(f"/v1/teams/{name}").status_code == 404
    busy, busy_client = new_team(live)
    job = busy_client.post("/v1/jobs", json={"command": "sleep 60"}).json()
    r = live.admin.delete(f"/v1/teams/{busy}")
    assert r.status_code == 409 and "active jobs" in r.json()["detail"]
    assert busy in {t["name"] for t in live.admin.get("/v1/teams").json()}
    assert busy_client.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
    audit = live.admin.get("/v1/audit", params={"limit": 100000}).json()
    assert any(e["action"] == "team-delete" and e["subject"] == name for e in audit)


def test_types_are_strict_at_the_edge(live):
    _, a = new_team(live)
    for body, field in (
        ({"command": "true", "gpus": True}, "gpus"),
        ({"command": "true", "gpus": "2"}, "gpus"),
        ({"command": "true", "tier": "1"}, "tier"),
        ({"command": 5}, "command"),
    ):
        r = a.post("/v1/jobs", json=body)
        assert r.status_code == 422 and field in r.json()["detail"], (body, r.text)
    r = live.admin.put("/v1/teams/strict", json={"weight": "2"})
    assert r.status_code == 422 and "weight" in r.json()["detail"]
    r = live.admin.put("/v1/teams/strict", json={"run_as": "not a user!"})
    assert r.status_code == 422 and "run_as" in r.json()["detail"]
    for prices, field in (
        ({"credit_value": 0}, "credit_value"),
        ({"currency": "€" * 2**20}, "currency"),
    ):
        r = live.admin.put("/v1/prices", json=prices)
        assert r.status_code == 422 and field in r.json()["detail"], r.text[:300]
    assert live.admin.get("/v1/prices").json().get("credit_value", 1.0) > 0


def test_a_body_that_is_not_declared_json_is_refused_415(live):
    _, a = new_team(live)
    body = b'{"command": "true"}'
    for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": ctype} if ctype else {}
        r = a.post("/v1/jobs", content=body, headers=headers)
        assert r.status_code == 415, (ctype, r.text)
        r = live.admin.put("/v1/teams/plain", content=b"{}", headers=headers)
        assert r.status_code == 415, (ctype, r.text)
    assert "plain" not in {t["name"] for t in live.admin.get("/v1/teams").json()}
    ok = a.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"})
    assert ok.status_code == 201, ok.text


def test_every_error_answers_in_the_shape_the_schema_documents(live):
    spec = httpx.get(f"{live.server.url}/openapi.json").json()
    problems = spec["components"]["schemas"]
    assert problems["ValidationProblem"]["properties"]["detail"]["type"] == "string"
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            documented = set(op["responses"])
            assert {"400", "401", "403", "404", "405", "409", "415", "422", "429"} <= documented, (
                method,
                path,
            )
    r = live.admin.post("/v1/jobs", json={"command": "true", "gpus": 0, "team": "x"})
    assert r.status_code == 422
    assert isinstance(r.json()["detail"], str) and r.json()["errors"][0]["loc"][-1] == "gpus"
    refused = live.admin.post("/v1/jobs", json={"command": "true"})  # no team: the loop refuses
    assert refused.status_code == 422 and refused.json()["errors"] == []
    wrong = live.admin.patch("/v1/jobs")
    assert wrong.status_code == 405 and isinstance(wrong.json()["detail"], str)
    # Allow lists every method the path takes, whichever router holds the route.
    assert wrong.headers["allow"] == "GET, POST"
    assert live.admin.post("/").headers["allow"] == "GET"  # the dashboard's


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory):
    """A server that allows 5 failed authentications per address per minute and shows
    per-team metrics to anyone."""
    root = tmp_path_factory.mktemp("strict")
    server = start_server(
        str(root / "a.db"), root / "state", "--auth-failures-per-minute", "5", "--public-metrics"
    )
    try:
        yield server
    finally:
        server.stop()
        server.kill()


def test_failed_authentications_are_limited_per_address(strict_server):
    admin = strict_server.client()
    assert admin.get("/v1/whoami").status_code == 200  # a known-good token
    url = f"{strict_server.url}/v1/jobs"
    for i in range(5):
        r = httpx.get(url, headers={"Authorization": f"Bearer guess-{i}"})
        assert r.status_code == 401, r.text
    r = httpx.get(url, headers={"Authorization": "Bearer guess-6"})
    assert r.status_code == 429, r.text
    assert 1 <= int(r.headers["Retry-After"]) <= 60
    malformed = httpx.get(url, headers={"Authorization": "Basic eDp5"})
    assert malformed.status_code == 429
    assert admin.get("/v1/whoami").status_code == 200  # a known token is never limited
    assert httpx.get(url).status_code == 401  # no token is no guess


def test_an_operator_may_make_per_team_metrics_public(strict_server):
    admin = strict_server.client()
    assert admin.put("/v1/teams/open", json={}).status_code == 200
    wait_for(lambda: "arbiter_team_" in httpx.get(f"{strict_server.url}/metrics").text)
    assert ADMIN not in httpx.get(f"{strict_server.url}/metrics").text
