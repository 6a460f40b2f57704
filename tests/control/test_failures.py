"""What happens to a job when something goes wrong, on the local backend with a real server: a
node fails under it, the server dies while it ends, or its command cannot start (docs/failures.md).
Grace and kill on the local backend are in test_local_backend.py."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_arbiter.backends.base import Placement
from gpu_arbiter.backends.local import LocalBackend
from gpu_arbiter.control.launch import ServerProcess
from gpu_arbiter.domain import JobFinished
from gpu_arbiter.domain.events import JobLaunchFailed
from tests.control.harness import Cluster, database, start_server, wait_for


@pytest.fixture
def db(tmp_path: Path) -> Iterator[str]:
    yield from database("sqlite", tmp_path)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def servers(db: str, state: Path) -> Iterator[list[ServerProcess]]:
    """The servers a test starts, all stopped after it (with the jobs they still run)."""
    started: list[ServerProcess] = []
    yield started
    for s in started:
        s.stop()  # a clean stop lets a launch in flight finish, so its job is found below
        s.kill()
    for rc in (state / "jobs").glob("*.json"):  # jobs outlive a killed server: end them too
        pid = json.loads(rc.read_text())["pid"]
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def serve(db: str, state: Path, servers: list[ServerProcess]) -> Cluster:
    server = start_server(db, state, "--min-grace", "1")
    servers.append(server)
    return Cluster(server)


def ledger_of(c: Cluster, job_id: str) -> list[dict]:
    entries = c.admin.get("/v1/ledger", params={"limit": 100000}).json()
    assert sum(p[1] for e in entries for p in e["postings"]) == 0  # balanced
    return [e for e in entries if e.get("job_id") == job_id]


def launch_then_kill_server(
    db: str, state: Path, servers: list[ServerProcess], team: str, command: str
) -> str:
    """Run a 1-GPU job under a fresh server and kill the server once the job's process is
    launched (not only recorded), leaving the job running without it. Returns the job id."""
    c = serve(db, state, servers)
    c.node("n1", 8)
    client = c.team(team, quota=8)
    job_id = client.post("/v1/jobs", json={"command": command, "gpus": 1}).json()["id"]
    wait_for(lambda: c.job(job_id)["state"] == "running")
    wait_for((state / "jobs" / f"{job_id}.json").exists)  # launched, not only recorded
    servers[-1].kill()
    c.close()
    return job_id


def exit_time(state: Path, job_id: str) -> float:
    """When the job's process ended, as its exit record (written by the job's wrapper) says."""
    rc = state / "jobs" / f"{job_id}.rc"
    wait_for(rc.exists, timeout_s=30)
    return rc.stat().st_mtime


# -- node failure (F1, F2, E3) ----------------------------------------------------------------


def test_a_node_failure_requeues_a_job_that_saved_through_the_sdk_from_its_checkpoint_at_its_tier(
    db, state, servers
):
    c = serve(db, state, servers)
    c.node("n1", 8)
    team = c.team("ckpt", quota=8)
    body = {"command": "sleep 300", "gpus": 8, "tier": 1}  # no --checkpoint-interval
    saved = team.post("/v1/jobs", json=body).json()["id"]
    wait_for(lambda: c.job(saved)["state"] == "running")
    c.node("n2", 8)  # where it goes once n1 has failed
    r = team.post(f"/v1/jobs/{saved}/telemetry", json={"event": "checkpoint", "step": 100})
    assert r.status_code == 200, r.text
    checkpoint_at = r.json()["at"]
    r = c.admin.post("/v1/nodes/n1/heartbeat", json={"xids": [79]})  # GPU fell off the bus
    assert r.status_code == 200, r.text

    job = wait_for(lambda: (j := c.job(saved))["restarts"] == 1 and j["state"] == "running" and j)
    assert job["tier"] == 1  # reported checkpoints: not demoted (E3)
    assert list(job["allocation"]["nodes"]) == ["n2"]
    assert job["exit_code"] is None and job["finished_at"] is None
    entries = ledger_of(c, saved)
    lost = [e for e in entries if e["reason"] == "lost-work"]
    assert len(lost) == 1 and lost[0]["start"] == pytest.approx(checkpoint_at)
    refund = [e for e in entries if e["kind"] == "refund" and e["refund_of"] == lost[0]["seq"]]
    assert refund and refund[0]["credits"] == pytest.approx(lost[0]["credits"])
    assert not [e for e in entries if e["reason"] == "rerun"]
    audit = c.admin.get("/v1/audit", params={"limit": 1000}).json()
    assert any(a["action"] == "node-down" and saved in a["detail"]["requeued"] for a in audit)


def test_a_job_displaced_by_a_node_failure_restarts_on_the_hot_spare_held_back_for_it(
    db, state, servers
):
    server = start_server(db, state, "--min-grace", "1", "--hot-spares", "1")
    servers.append(server)
    c = Cluster(server)
    for name in ("n1", "n2", "n3"):
        c.node(name, 8)
    team = c.team("spares", quota=24)
    ids = [
        team.post("/v1/jobs", json={"command": "sleep 300", "gpus": 8, "tier": 1}).json()["id"]
        for _ in range(3)
    ]
    wait_for(lambda: [c.job(j)["state"] for j in ids] == ["running", "running", "pending"])
    (node,) = c.job(ids[0])["allocation"]["nodes"]
    assert node != "n3"  # the spare is held back, though a job waits
    r = c.admin.post(f"/v1/nodes/{node}/heartbeat", json={"xids": [79]})
    assert r.status_code == 200, r.text
    job = wait_for(lambda: (j := c.job(ids[0]))["restarts"] == 1 and j["state"] == "running" and j)
    assert list(job["allocation"]["nodes"]) == ["n3"]
    assert c.job(ids[2])["state"] == "pending"


# -- the server dies while a job ends (exactly once) ------------------------------------------


def test_a_job_that_ends_while_the_server_is_down_is_recorded_at_its_real_end_and_not_rerun(
    db, state, servers
):
    job_id = launch_then_kill_server(db, state, servers, "restart", "echo ran; sleep 2")
    ended = exit_time(state, job_id)
    # The worst moment: the server had seen the exit and dropped the job's process record,
    # then died before committing the job's end.
    (state / "jobs" / f"{job_id}.json").unlink(missing_ok=True)
    time.sleep(1.0)

    c = serve(db, state, servers)
    job = wait_for(lambda: (j := c.job(job_id))["state"] != "running" and j)
    assert job["state"] == "completed" and job["restarts"] == 0
    assert job["finished_at"] == pytest.approx(ended, abs=0.01)
    charges = [e for e in ledger_of(c, job_id) if e["kind"] == "charge"]
    assert len(charges) == 1 and charges[0]["end"] == pytest.approx(ended, abs=0.01)
    log = c.admin.get(f"/v1/jobs/{job_id}/log").text
    assert log.count("ran") == 1, log


def test_a_job_adopted_after_a_restart_that_has_ended_is_charged_only_to_its_end(
    db, state, servers
):
    job_id = launch_then_kill_server(db, state, servers, "adopt", "sleep 2; exit 3")
    ended = exit_time(state, job_id)
    time.sleep(1.5)

    c = serve(db, state, servers)
    job = wait_for(lambda: (j := c.job(job_id))["state"] != "running" and j)
    assert (job["state"], job["exit_code"]) == ("failed", 3)
    assert job["finished_at"] == pytest.approx(ended, abs=0.01)
    charges = [e for e in ledger_of(c, job_id) if e["kind"] == "charge"]
    assert len(charges) == 1 and charges[0]["end"] == pytest.approx(ended, abs=0.01)


def test_a_job_whose_fate_is_unknown_after_a_restart_runs_again_and_the_audit_says_why(
    db, state, servers
):
    job_id = launch_then_kill_server(db, state, servers, "unknown", "sleep 300")
    proc = state / "jobs" / f"{job_id}.json"
    pid = json.loads(proc.read_text())["pid"]
    os.killpg(pid, signal.SIGKILL)  # gone, wrapper and all: no exit code was written
    proc.unlink()

    c = serve(db, state, servers)
    audit = wait_for(
        lambda: [
            a
            for a in c.admin.get("/v1/audit", params={"limit": 1000}).json()
            if a["action"] == "requeue" and a["subject"] == job_id
        ]
    )
    assert "does not know how it ended" in audit[0]["detail"]["reason"]
    wait_for(lambda: c.job(job_id)["state"] == "running")


# -- launch failures ---------------------------------------------------------------------------


def test_a_command_that_cannot_start_fails_at_once_frees_its_gpus_and_costs_nothing(
    db, state, servers
):
    c = serve(db, state, servers)
    c.node("n1", 8)
    team = c.team("launch", quota=8)
    body = {"command": "no-such-program-arbiter --train", "gpus": 8}
    bad = team.post("/v1/jobs", json=body).json()["id"]
    job = wait_for(lambda: (j := c.job(bad))["state"] == "failed" and j)
    assert "could not start" in job["reason"] and "no-such-program-arbiter" in job["reason"]
    assert not ledger_of(c, bad)
    good = team.post("/v1/jobs", json={"command": "true", "gpus": 8}).json()["id"]
    wait_for(lambda: c.job(good)["state"] == "completed")  # the GPUs were released


def test_what_exec_cannot_take_is_refused_at_submit_naming_the_field(db, state, servers):
    c = serve(db, state, servers)
    c.node("n1", 8)
    team = c.team("edge", quota=8)
    for body, field in (
        ({"command": "echo a\u0000b"}, "command"),
        ({"command": "true", "env": {"X": "a\u0000b"}}, "env"),
        ({"command": "true", "env": {f"V{i}": "x" * 4096 for i in range(64)}}, "env"),
    ):
        r = team.post("/v1/jobs", json=body)
        assert r.status_code == 422, r.text
        assert r.json()["detail"].startswith(f"body.{field}") or field in r.json()["detail"]
    assert c.admin.get("/v1/jobs").json() == []


def test_the_local_backend_reports_an_environment_exec_refuses_as_a_launch_failure(tmp_path):
    b = LocalBackend(tmp_path, allow_root=True)
    b.start(Placement("big", "true", {"n1": (0,)}, "H100", env={"BIG": "x" * 3_000_000}))
    b.start(Placement("nul", "true", {"n1": (1,)}, "H100", env={"N": "a\0b"}))
    got = b.poll()
    assert {(type(e), e.job_id) for e in got} == {
        (JobLaunchFailed, "big"),
        (JobLaunchFailed, "nul"),
    }
    assert "too large" in next(e for e in got if e.job_id == "big").reason
    assert b.running() == []


def test_the_local_backend_looks_a_program_up_where_the_job_runs_as_slurms_wrapper_does(
    tmp_path,
):
    b = LocalBackend(tmp_path / "state", allow_root=True)
    own = b.jobs_root / "rel"  # the job's working directory, kept across its runs
    own.mkdir(parents=True)
    (own / "run.sh").write_text("#!/bin/sh\nexit 0\n")
    (own / "run.sh").chmod(0o755)
    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/sh\nexit 0\n")
    b.start(Placement("rel", "./run.sh --x", {"n1": (0,)}, "H100"))
    b.start(Placement("plain", f"{plain} --x", {"n1": (1,)}, "H100"))
    ended: dict[str, object] = {}
    wait_for(lambda: ended.update((e.job_id, e) for e in b.poll()) or len(ended) == 2)
    assert isinstance(ended["rel"], JobFinished), ended
    assert ended["plain"] == JobLaunchFailed(
        "plain", ended["plain"].at, f"{plain}: not found or not executable"
    )
