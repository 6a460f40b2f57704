"""The cluster's own history, end to end: jobs run on a live service (local backend, fake GPUs)
are exported as a trace, replayed on the same cluster (queueing close to what it really was),
and replayed with half the nodes by `arbiter whatif`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.control.harness import ADMIN, Cluster, database, start_server, wait_for

JOBS = 12  # 8-GPU jobs on two 8-GPU nodes: they queue six deep
RUN_S = 2.0
# A replay on the same cluster must reproduce the real queueing within this much of the mean
# (plus two seconds for the live loop's ticks and process starts, which a replay has not).
TOLERANCE = 0.25


def arbiter(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_arbiter.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def db(request, tmp_path_factory):
    yield from database(request.param, tmp_path_factory.mktemp("db"))


@pytest.fixture(scope="module")
def history(db, tmp_path_factory):
    """Run the jobs, export the history through the API; (file, database URL, server URL, a
    team's token)."""
    server = start_server(db, tmp_path_factory.mktemp("state"), "--min-grace", "1")
    c = Cluster(server)
    try:
        c.node("n1", 8)
        c.node("n2", 8)
        teams = {"ads": c.team("ads", quota=8), "llm": c.team("llm", quota=8)}
        ids = []
        for k in range(JOBS):
            team = ("ads", "llm")[k % 2]
            body = {"command": f"sleep {RUN_S}", "gpus": 8, "tier": 2, "walltime_s": 600}
            r = teams[team].post("/v1/jobs", json=body)
            assert r.status_code in (200, 201), r.text
            ids.append(r.json()["id"])
        wait_for(
            lambda: all(c.job(i)["state"] == "completed" for i in ids),
            timeout_s=180,
            explain=lambda: str([c.job(i)["state"] for i in ids]),
        )
        out = tmp_path_factory.mktemp("history") / "history.jsonl"
        done = arbiter(
            "history", "export", "--url", server.url, "--token", ADMIN, "--out", str(out)
        )
        assert done.returncode == 0, done.stderr
        team_token = teams["ads"].headers["Authorization"].removeprefix("Bearer ")
        yield out, db, server.url, team_token
        for t in teams.values():
            t.close()
    finally:
        c.close()
        server.close()


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_the_export_holds_every_job_with_its_segments_and_what_was_in_force(history, tmp_path):
    path, db, _, _ = history
    header, *jobs = lines(path)
    assert (header["format"], header["version"]) == ("arbiter-history", 1)
    assert sorted(n["name"] for r in header["cluster"]["racks"] for n in r["nodes"]) == [
        "n1",
        "n2",
    ]
    assert {t["name"] for t in header["teams"]} >= {"ads", "llm"}
    assert len(jobs) == JOBS
    for job in jobs:
        assert job["state"] == "completed" and job["tier_requested"] == 2
        assert job["gpus"] == 8 and job["walltime_s"] == 600
        (seg,) = job["segments"]
        assert seg["gpu_type"] == "H100" and seg["gpus"] == 8
        assert seg["end"] - seg["start"] >= RUN_S
        assert job["first_start"] >= job["submitted_at"]
    # Straight from the database: the same jobs, line for line.
    offline = tmp_path / "offline.jsonl"
    done = arbiter("history", "export", "--db", db, "--out", str(offline))
    assert done.returncode == 0, done.stderr
    assert lines(offline)[1:] == jobs


def test_a_same_cluster_replay_reproduces_the_real_queueing(history, tmp_path):
    path, _, _, _ = history
    out = tmp_path / "bench"
    done = arbiter(
        "bench", "--trace", str(path), "--format", "arbiter", "--policies", "arbiter",
        "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["cluster"]["gpus"] == 16
    fidelity = results["queueing_real_vs_replayed"]
    real, replayed = fidelity["real"], fidelity["replayed"]["arbiter"]
    assert real["jobs"] == replayed["jobs"] == JOBS
    # Twelve jobs, two at a time, for RUN_S each: the queue is real and several RUN_S deep.
    assert real["mean_s"] > 2 * RUN_S
    assert abs(replayed["mean_s"] - real["mean_s"]) <= TOLERANCE * real["mean_s"] + 2.0
    assert "Real against replayed queueing" in (out / "report.md").read_text()


def test_history_export_refuses_bad_input_in_one_line(history, tmp_path):
    _, _, url, team_token = history
    for args in (
        ("--since", "last tuesday"),
        ("--token", "not-a-token"),
        ("--token", team_token),  # the history is the admin's: every team's jobs
    ):
        done = arbiter("history", "export", "--url", url, "--token", ADMIN,
                       "--out", str(tmp_path / "h.jsonl"), *args)  # fmt: skip
        assert done.returncode == 2
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert not (tmp_path / "h.jsonl").exists()


def test_a_what_if_with_half_the_nodes_queues_more_for_the_same_work(history, tmp_path):
    path, _, _, _ = history
    half = tmp_path / "half.yaml"
    half.write_text(
        "name: half\nracks:\n  - name: r0\n    nodes:\n"
        "      - {name: n1, gpu_type: H100, gpus: 8}\n"
    )
    out = tmp_path / "whatif"
    done = arbiter("whatif", "--history", str(path), "--cluster", str(half), "--out", str(out))
    assert done.returncode == 0, done.stderr
    doc = json.loads((out / "results.json").read_text())
    before, after = doc["columns"]["as it was"], doc["columns"][f"cluster {half}"]
    assert (before["gpus"], after["gpus"]) == (16, 8)
    assert before["all"]["completed"] == after["all"]["completed"] == JOBS
    assert after["work_done_h100_gpu_hours"] == pytest.approx(before["work_done_h100_gpu_hours"])
    assert after["all"]["mean_queue_s"] > before["all"]["mean_queue_s"] + RUN_S
    for team in ("ads", "llm"):
        assert after["by_team"][team]["mean_queue_s"] > before["by_team"][team]["mean_queue_s"]
        assert before["spend_by_team"][team] > 0 and after["spend_by_team"][team] > 0
    assert before["tco"]["cost_per_useful_gpu_hour"] > 0
    assert (out / "report.md").is_file() and (out / "queueing_by_team.png").stat().st_size > 0


def test_an_offline_export_never_creates_an_empty_database(tmp_path):
    done = arbiter("history", "export", "--db", str(tmp_path / "none.db"),
                   "--out", str(tmp_path / "h.jsonl"))  # fmt: skip
    assert done.returncode == 2 and "no such database file" in done.stderr
    assert not (tmp_path / "none.db").exists() and not (tmp_path / "h.jsonl").exists()
