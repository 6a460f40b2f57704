"""The Slurm-like client against a live server: submit, queue --json, cancel, nodes, teams,
bill --url, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from gpu_arbiter.cli.client import queue_row
from gpu_arbiter.control.launch import free_port
from tests.control.harness import wait_for


def arbiter(live, token: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ARBITER_URL": live.server.url, "ARBITER_TOKEN": token}
    return subprocess.run(
        [sys.executable, "-m", "gpu_arbiter.cli", *args],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip


def test_submit_queue_cancel_nodes_teams_and_bill_from_the_command_line(live):
    client = live.team("clitool", quota=2)
    token = client.headers["Authorization"].split()[1]
    out = arbiter(live, token, "submit", "--gpus", "1", "--name", "hello", "--key", "k", "--json",
                  "--", "sleep", "30")  # fmt: skip
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)
    assert job["name"] == "hello" and job["command"] == "sleep 30"
    wait_for(lambda: live.job(job["id"])["state"] == "running")
    queue = json.loads(arbiter(live, token, "queue", "--json").stdout)
    assert [j["id"] for j in queue] == [job["id"]]
    assert "hello" in arbiter(live, token, "queue").stdout
    assert arbiter(live, token, "cancel", job["id"]).returncode == 0
    assert live.job(job["id"])["state"] == "cancelled"
    nodes = json.loads(arbiter(live, token, "nodes", "--json").stdout)
    assert [n["name"] for n in nodes] == ["n1"]
    teams = json.loads(arbiter(live, token, "teams", "--json").stdout)
    assert [t["name"] for t in teams] == ["clitool"]
    bill = arbiter(live, token, "bill", "--url", live.server.url, "--json")
    assert bill.returncode == 0, bill.stderr
    assert [b["team"] for b in json.loads(bill.stdout)] == ["clitool"]
    assert arbiter(live, token, "bill", "--url", live.server.url).returncode == 0
    by_env = arbiter(live, token, "bill", "--json")  # the URL from ARBITER_URL
    assert by_env.returncode == 0, by_env.stderr
    assert [b["team"] for b in json.loads(by_env.stdout)] == ["clitool"]
    wide = arbiter(live, token, "bill").stdout  # piped: the table at its own width, not cut
    assert "clitool" in wide and "…" not in wide


def test_a_refused_submission_is_one_line_and_exit_code_2(live):
    client = live.team("clierr", quota=0)
    token = client.headers["Authorization"].split()[1]
    out = arbiter(live, token, "submit", "--gpus", "64", "--", "true")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "422" in out.stderr and "64 GPUs" in out.stderr
    out = arbiter(live, "wrong-token", "queue")
    assert out.returncode == 2 and "401" in out.stderr


def test_queue_shows_why_a_pending_job_waits_and_a_url_list_moves_past_a_dead_server(live):
    live.node("n1", 8)  # a heartbeat: no agent sends them here
    client = live.team("cliwhy", quota=0)
    token = client.headers["Authorization"].split()[1]
    big = client.post("/v1/jobs", json={"command": "sleep 120", "gpus": 8}).json()["id"]
    wait_for(lambda: live.job(big)["state"] == "running")
    waiting = client.post("/v1/jobs", json={"command": "true", "gpus": 8}).json()["id"]
    try:
        dead = f"http://127.0.0.1:{free_port()}"
        env = {**os.environ, "ARBITER_URL": f"{dead},{live.server.url}", "ARBITER_TOKEN": token}
        out = subprocess.run(
            [sys.executable, "-m", "gpu_arbiter.cli", "queue"],
            capture_output=True, text=True, env={**env, "COLUMNS": "400"}, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        line = next(x for x in out.stdout.splitlines() if f" {waiting} " in x)
        assert "pending" in line and "capacity: " in line
    finally:
        for job in (big, waiting):
            client.post(f"/v1/jobs/{job}/cancel")


def _job(**kw) -> dict:
    return {
        "id": "j1",
        "name": "",
        "team": "t",
        "tier": 3,
        "state": "pending",
        "gpus": 1,
        "allocation": None,
        "submitted_at": 100.0,
        "started_at": None,
        "finished_at": None,
        "reason": "",
        **kw,
    }


def test_a_finished_job_s_time_stops_at_its_end():
    done = _job(state="completed", started_at=1000.0, finished_at=1100.0)
    assert queue_row(done, {})[7] == "0:01:40"
    never_ran = _job(state="cancelled", finished_at=1100.0)
    assert queue_row(never_ran, {})[7] == "-"


def test_a_requeued_job_shows_why_it_waits_now_not_what_happened_to_it_last():
    requeued = _job(reason="stopped after preemption")
    assert queue_row(requeued, {"j1": "capacity: 8 free"})[8] == "capacity: 8 free"
    running = _job(state="running", started_at=1000.0, reason="budget of team t spent")
    assert queue_row(running, {"j1": "stale"})[8] == "budget of team t spent"
