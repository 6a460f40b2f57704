"""The Slurm-like client against a live server: submit, queue --json, cancel, nodes, teams,
bill --url, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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


def test_a_refused_submission_is_one_line_and_exit_code_2(live):
    client = live.team("clierr", quota=0)
    token = client.headers["Authorization"].split()[1]
    out = arbiter(live, token, "submit", "--gpus", "64", "--", "true")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "422" in out.stderr and "64 GPUs" in out.stderr
    out = arbiter(live, "wrong-token", "queue")
    assert out.returncode == 2 and "401" in out.stderr
