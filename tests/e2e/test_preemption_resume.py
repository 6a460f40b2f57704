"""A tier-1 job preempts a running tier-3 training job, which resumes from its checkpoint and
ends with exactly the weights of a run that was never interrupted (S1, F2, F6)."""

from __future__ import annotations

import json
import shlex
import sys

from gpu_arbiter.control.launch import start_agent
from gpu_arbiter.examples.train_tiny import train
from tests.control.harness import Cluster, start_server, wait_for

STEPS = 150


def test_a_preempted_training_job_resumes_from_its_checkpoint(db, tmp_path):
    server = start_server(db, tmp_path / "state", "--min-grace", "10", "--heartbeat-timeout", "20")
    agent = start_agent(
        server.url,
        "admin-test-token",
        "gpu-a",
        4,
        "H100",
        interval_s=1.0,
        log_path=tmp_path / "agent.log",
    )
    c = Cluster(server)
    try:
        wait_for(lambda: c.admin.get("/v1/nodes").json())
        research = c.team("research", quota=0)
        core = c.team("core", quota=2)
        out = tmp_path / "result.json"
        command = shlex.join(
            [
                sys.executable,
                "-m",
                "gpu_arbiter.examples.train_tiny",
                "--steps",
                str(STEPS),
                "--step-time",
                "0.04",
                "--every",
                "0.5",
                "--backend",
                "numpy",
                "--out",
                str(out),
            ]
        )
        low = research.post(
            "/v1/jobs",
            json={
                "command": command,
                "gpus": 4,
                "tier": 3,
                "checkpoint_interval_s": 1,
            },
        ).json()["id"]
        wait_for(lambda: c.job(low)["telemetry"].get("step", 0) >= 30, timeout_s=120)
        top = core.post("/v1/jobs", json={"command": "sleep 2", "gpus": 4, "tier": 1}).json()
        assert top["tier"] == 1
        wait_for(lambda: c.job(top["id"])["state"] == "completed", timeout_s=120)
        done = wait_for(lambda: (j := c.job(low))["state"] == "completed" and j, timeout_s=180)
        assert done["preemptions"] == 1

        result = json.loads(out.read_text())
        assert result["resumed_from"] >= 30
        assert (
            result["w"] == train(STEPS, checkpoint_dir=str(tmp_path / "ref"), backend="numpy")["w"]
        )
        log = research.get(f"/v1/jobs/{low}/log").text
        assert f"resumed from step {result['resumed_from']}" in log

        charges = research.get("/v1/ledger", params={"job": low}).json()
        assert [e["reason"] for e in charges] == ["run", "run"]
        assert all(e["preemptible"] for e in charges)
        everything = c.admin.get("/v1/ledger").json()
        assert sum(p[1] for e in everything for p in e["postings"]) == 0
    finally:
        c.close()
        agent.terminate()
        agent.wait(timeout=30)
        server.close()
