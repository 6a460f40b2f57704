"""The admin's commands against a live server: teams, tokens, prices, nodes, a job's record and
log, and DELETE /v1/teams under them."""

from __future__ import annotations

import json

import pytest

from tests.control.harness import ADMIN, wait_for
from tests.control.test_cli_client import arbiter


def ok(out) -> str:
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_teams_create_set_list_and_delete(live):
    ok(arbiter(live, ADMIN, "teams", "create", "adm-a", "--quota", "H100=2", "--weight", "2",
               "--budget", "500"))  # fmt: skip
    out = arbiter(live, ADMIN, "teams", "create", "adm-a")
    assert out.returncode == 2 and "already exists" in out.stderr
    ok(arbiter(live, ADMIN, "teams", "set", "adm-a", "--run-as", "nobody"))
    ok(arbiter(live, ADMIN, "teams", "set", "adm-a", "--weight", "3"))
    team = next(t for t in json.loads(ok(arbiter(live, ADMIN, "teams", "--json")))
                if t["name"] == "adm-a")  # fmt: skip
    # `set` changed the weight and left the quota, budget and run_as user as they were
    assert (team["weight"], team["quota"], team["budget_per_period"]) == (3.0, {"H100": 2}, 500)
    assert team["run_as"] == "nobody"
    ok(arbiter(live, ADMIN, "teams", "set", "adm-a", "--budget", "none"))
    listed = json.loads(ok(arbiter(live, ADMIN, "teams", "list", "--json")))
    assert next(t for t in listed if t["name"] == "adm-a")["budget_per_period"] is None
    assert "adm-a" in ok(arbiter(live, ADMIN, "teams"))
    out = arbiter(live, ADMIN, "teams", "set", "adm-a", "--quota", "H100=999")
    assert out.returncode == 2 and out.stderr.count("\n") == 1  # the server's refusal
    out = arbiter(live, ADMIN, "teams", "create", "adm-b", "--quota", "H100:2")
    assert out.returncode == 2 and "--quota 'H100:2'" in out.stderr
    ok(arbiter(live, ADMIN, "teams", "delete", "adm-a"))
    names = [t["name"] for t in json.loads(ok(arbiter(live, ADMIN, "teams", "--json")))]
    assert "adm-a" not in names
    out = arbiter(live, ADMIN, "teams", "delete", "adm-a")
    assert out.returncode == 2 and "404" in out.stderr


def test_a_teams_breaker_policy_and_webhook_pass_through_and_survive_a_set(live):
    def team() -> dict:
        rows = json.loads(ok(arbiter(live, ADMIN, "teams", "--json")))
        return next(t for t in rows if t["name"] == "adm-brk")

    ok(arbiter(live, ADMIN, "teams", "create", "adm-brk", "--breaker-policy", "flag",
               "--webhook", "https://hooks.example.org/arbiter"))  # fmt: skip
    assert (team()["breaker_policy"], team()["webhook_url"]) == (
        "flag",
        "https://hooks.example.org/arbiter",
    )
    ok(arbiter(live, ADMIN, "teams", "set", "adm-brk", "--weight", "2"))
    assert team()["breaker_policy"] == "flag" and team()["webhook_url"]
    ok(arbiter(live, ADMIN, "teams", "set", "adm-brk", "--webhook", "none"))
    assert team()["webhook_url"] is None and team()["breaker_policy"] == "flag"
    out = arbiter(live, ADMIN, "teams", "set", "adm-brk", "--breaker-policy", "explode")
    assert out.returncode == 2 and "breaker_policy" in out.stderr


def test_deleting_a_team_revokes_its_tokens_and_keeps_its_active_jobs(live):
    client = live.team("adm-busy", quota=1)
    job = client.post("/v1/jobs", json={"command": "sleep 60", "gpus": 1}).json()
    r = live.admin.delete("/v1/teams/adm-busy")
    assert r.status_code == 409 and job["id"] in r.json()["detail"]
    assert client.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
    r = live.admin.delete("/v1/teams/adm-busy")
    assert r.status_code == 200, r.text
    assert client.get("/v1/jobs").status_code == 401  # its token died with it
    assert live.job(job["id"])["team"] == "adm-busy"  # history stays
    assert client.delete("/v1/teams/anything").status_code == 401
    live.team("adm-other")
    other = live.team("adm-other2")
    assert other.delete("/v1/teams/adm-other").status_code == 403
    assert live.admin.delete("/v1/teams/no-such-team").status_code == 404


def test_tokens_create_list_revoke_and_an_agent_registers_with_one(live):
    ok(arbiter(live, ADMIN, "teams", "create", "adm-tok", "--quota", "H100=0"))
    out = arbiter(live, ADMIN, "tokens", "create", "--team", "adm-tok", "--label", "ci")
    token = ok(out).strip()
    assert token.startswith("arb_") and "\n" not in token  # stdout is the token alone
    assert "shown only now" in out.stderr
    assert ok(arbiter(live, token, "queue", "--json")).strip() == "[]"
    rows = json.loads(ok(arbiter(live, ADMIN, "tokens", "list", "--json")))
    mine = next(t for t in rows if t["team"] == "adm-tok")
    assert mine["label"] == "ci" and "token" not in mine and "hash" not in mine
    ok(arbiter(live, ADMIN, "tokens", "revoke", str(mine["id"])))
    assert arbiter(live, token, "queue").returncode == 2
    agent = ok(arbiter(live, ADMIN, "tokens", "create", "--agent")).strip()
    r = live.server.client(agent).put("/v1/nodes/adm-n", json={"gpu_type": "H100", "gpus": 1})
    assert r.status_code == 200, r.text
    assert live.server.client(agent).get("/v1/tokens").status_code == 403
    out = arbiter(live, "arb_wrong", "agent", "--fake-gpus", "1", "--gpu-type", "H100")
    assert out.returncode == 2 and out.stderr.splitlines() == [
        "arbiter: error: the server refused this node: 401: unknown or revoked token"
    ]


def test_prices_show_and_set_change_only_what_is_given(live):
    before = json.loads(ok(arbiter(live, ADMIN, "prices", "show", "--json")))
    ok(arbiter(live, ADMIN, "prices", "set", "--multiplier", "A100=0.5", "--on-demand", "1=4",
               "--credit-value", "0.9"))  # fmt: skip
    after = json.loads(ok(arbiter(live, ADMIN, "prices", "--json")))
    assert after["gpu_multipliers"]["A100"] == 0.5 and after["credit_value"] == 0.9
    assert after["on_demand"]["1"] == 4 and after["on_demand"]["2"] == before["on_demand"]["2"]
    assert after["gpu_multipliers"]["H100"] == before["gpu_multipliers"]["H100"]
    out = arbiter(live, ADMIN, "prices", "set", "--preemptible", "3=99")
    assert out.returncode == 2 and "preemptible" in out.stderr  # dearer than on demand
    assert "credits per H100-hour" in ok(arbiter(live, ADMIN, "prices"))
    ok(arbiter(live, ADMIN, "prices", "set", "--on-demand", "1=3.5", "--credit-value", "1"))


def test_nodes_cordon_and_uncordon(live):
    live.node("adm-c", 1)
    row = json.loads(ok(arbiter(live, ADMIN, "nodes", "cordon", "adm-c", "--reason", "fans",
                                "--json")))  # fmt: skip
    assert (row["state"], row["reason"]) == ("cordoned", "fans")
    listed = ok(arbiter(live, ADMIN, "nodes"))
    assert "fans" in listed and "cordoned" in listed
    assert (
        json.loads(ok(arbiter(live, ADMIN, "nodes", "uncordon", "adm-c", "--json")))["state"]
        == "up"
    )
    out = arbiter(live, ADMIN, "nodes", "cordon", "no-such-node")
    assert out.returncode == 2 and "404" in out.stderr


def test_jobs_show_logs_and_cancel_that_says_what_failed(live):
    client = live.team("adm-jobs", quota=1)
    token = client.headers["Authorization"].split()[1]
    done = client.post("/v1/jobs", json={"command": "echo hello from the job"}).json()
    wait_for(lambda: live.job(done["id"])["state"] == "completed")
    assert ok(arbiter(live, token, "logs", done["id"])) == "hello from the job\n"
    as_json = json.loads(ok(arbiter(live, token, "logs", done["id"], "--json")))
    assert as_json == {"id": done["id"], "log": "hello from the job\n"}
    shown = ok(arbiter(live, token, "jobs", "show", done["id"]))
    assert "completed" in shown and "echo hello from the job" in shown
    assert (
        json.loads(ok(arbiter(live, token, "jobs", "show", done["id"], "--json")))["exit_code"] == 0
    )
    running = client.post("/v1/jobs", json={"command": "sleep 60"}).json()
    out = arbiter(live, token, "cancel", running["id"], "j-none", done["id"])
    assert out.returncode == 2
    assert out.stdout == f"Cancelled job {running['id']}\n"
    lines = out.stderr.splitlines()
    assert len(lines) == 2 and "j-none" in lines[0] and done["id"] in lines[1]
    assert "already completed" in lines[1]


@pytest.mark.parametrize("command", ["teams", "tokens", "prices", "nodes"])
def test_a_team_token_cannot_use_the_admin_verbs(live, command):
    client = live.team(f"adm-{command}", quota=0)
    token = client.headers["Authorization"].split()[1]
    verb = {
        "teams": ("create", "x"),
        "tokens": ("create", "--agent"),
        "prices": ("set", "--credit-value", "2"),
        "nodes": ("cordon", "n1"),
    }[command]
    out = arbiter(live, token, command, *verb)
    assert out.returncode == 2 and "403" in out.stderr and out.stderr.count("\n") == 1
