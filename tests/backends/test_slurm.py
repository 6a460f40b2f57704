"""Arbiter's decisions carried out by a real (single-host) Slurm: sbatch with the chosen nodes
and GPU counts, CUDA_VISIBLE_DEVICES as Arbiter records it, TERM-then-kill preemption with a
grace, and drained nodes reported as faults. Skipped when Slurm is not installed."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from gpu_arbiter.backends.base import Placement
from gpu_arbiter.backends.slurm import SlurmBackend
from gpu_arbiter.backends.slurm_inventory import (
    is_fault,
    parse_exit_code,
    parse_job_gpus,
    parse_nodes,
    parse_topology,
)
from gpu_arbiter.control.launch import ServerProcess
from gpu_arbiter.domain import Event, JobFinished, JobStopped
from gpu_arbiter.domain.events import JobFailed, JobPlaced, NodeDown, NodeUp

# These tests run as root and mean their jobs to run as root (a deployment must not).
ROOT = {"allow_root": True}

# -- parsing, no Slurm needed ----------------------------------------------------------------

SHOW_JOB = """JobId=7 HetJobId=7 HetJobOffset=0 JobName=arbiter-j1
   JobState=RUNNING Reason=None Dependency=(null)
     Nodes=node1 CPU_IDs=0 Mem=1000 GRES=gpu:h100:2(IDX:0-1,4)
JobId=8 HetJobId=7 HetJobOffset=1 JobName=arbiter-j1
     Nodes=node[2-3] CPU_IDs=1 Mem=1000 GRES=gpu:h100:1(IDX:3)
   ExitCode=0:0
"""


def _expand(hostlist: str) -> list[str]:
    return {"node[2-3]": ["node2", "node3"]}.get(hostlist, [hostlist])


def test_job_gpus_are_read_per_node_from_gres_idx_including_heterogeneous_components():
    gpus = parse_job_gpus(SHOW_JOB, _expand)
    assert gpus == {"node1": (0, 1, 4), "node2": (3,), "node3": (3,)}


def test_drained_down_and_unresponsive_states_are_faults_and_busy_states_are_not():
    for state in ("drained", "draining", "down*", "idle+drain", "mixed*", "down+not_responding"):
        assert is_fault(state), state
    for state in ("idle", "mixed", "allocated", "completing"):
        assert not is_fault(state), state


def test_exit_code_is_negative_signal_when_a_signal_ended_the_job():
    assert parse_exit_code("JobState=FAILED ExitCode=3:0") == 3
    assert parse_exit_code("JobState=CANCELLED ExitCode=0:15") == -15


def test_nodes_take_gpu_type_from_gres_and_rack_from_the_leaf_switch():
    show = (
        "NodeName=node1 Gres=gpu:h100:8(S:0-1) State=IDLE Partitions=gpu Reason=(null)\n"
        "NodeName=node2 Gres=gpu:a100:4 State=IDLE+DRAIN Partitions=gpu Reason=bad ecc [root]\n"
        "NodeName=login Gres=(null) State=IDLE Partitions=login\n"
    )
    racks = parse_topology(
        "SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=node1\n"
        "SwitchName=spine Level=1 LinkSpeed=1 Switches=leaf1\n",
        _expand,
    )
    nodes = parse_nodes(show, racks, partition="gpu")
    assert [(n.name, n.gpu_type, n.gpus, n.rack, n.faulty) for n in nodes] == [
        ("node1", "H100", 8, "leaf1", False),
        ("node2", "A100", 4, "rack0", True),
    ]
    assert nodes[1].reason == "bad ecc [root]"


# -- against the real test Slurm -------------------------------------------------------------


def _slurm(conf: str, *argv: str) -> str:
    env = {**os.environ, "SLURM_CONF": conf}
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def backend(slurm_conf: str, tmp_path: Path) -> Iterator[SlurmBackend]:
    b = SlurmBackend(
        tmp_path / "jobs", partition="gpu", poll_interval_s=0.2, slurm_conf=slurm_conf, **ROOT
    )
    yield b
    for job_id in list(b._jobs):
        b.stop(job_id, 0.0)


def _wait(b: SlurmBackend, until: Callable[[list[Event]], bool], timeout_s: float = 30) -> list:
    seen: list[Event] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen += b.poll()
        if until(seen):
            return seen
        time.sleep(0.1)
    raise AssertionError(f"timed out; events so far: {seen}")


def _of(events: list, kind: type, job_id: str | None = None) -> list:
    return [e for e in events if isinstance(e, kind) and (job_id is None or e.job_id == job_id)]


def _log(b: SlurmBackend, job_id: str, needle: str, timeout_s: float = 20) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        path = b.log_path(job_id)
        if path.exists() and needle in (text := path.read_text()):
            return text
        time.sleep(0.1)
    raise AssertionError(f"{needle!r} not in the log of {job_id}")


def test_job_sees_exactly_the_gpus_arbiter_records_when_slurm_picks_other_indices(backend):
    # Arbiter chose GPUs 6,7 of node1; Slurm picks the indices itself (lowest free first).
    # It runs for longer than a poll: Slurm forgets the indices once a job has ended.
    command = "echo CVD=$CUDA_VISIBLE_DEVICES; sleep 2"
    placement = Placement("s1", command, {"node1": (6, 7)}, "H100")
    backend.start(placement)
    events = _wait(backend, lambda ev: _of(ev, JobFinished, "s1"))
    placed = _of(events, JobPlaced, "s1")
    recorded = dict(placed[0].gpus_by_node) if placed else dict(placement.gpus_by_node)
    seen = _log(backend, "s1", "CVD=").split("CVD=")[1].split()[0]
    assert seen == ",".join(str(g) for g in recorded["node1"])
    assert len(recorded["node1"]) == 2


def test_grace_stop_sends_term_to_the_job_which_saves_and_is_reported_stopped(backend):
    script = "trap 'echo saved-on-term; exit 0' TERM; echo started; while :; do sleep 0.2; done"
    backend.start(Placement("s2", script, {"node1": (0,)}, "H100"))
    _log(backend, "s2", "started")
    t0 = time.monotonic()
    backend.stop("s2", 60.0)
    events = _wait(backend, lambda ev: _of(ev, JobStopped, "s2"))
    assert time.monotonic() - t0 < 20  # the job left on the notice, long before its grace
    assert not _of(events, JobFailed)
    assert "saved-on-term" in _log(backend, "s2", "saved-on-term")


def test_job_ignoring_term_is_killed_when_its_grace_runs_out(backend):
    backend.start(Placement("s3", "trap '' TERM; echo started; sleep 300", {"node2": (0,)}, "H100"))
    _log(backend, "s3", "started")
    t0 = time.monotonic()
    backend.stop("s3", 2.0)
    _wait(backend, lambda ev: _of(ev, JobStopped, "s3"), timeout_s=40)
    assert 2.0 <= time.monotonic() - t0 < 40


def test_tier3_stop_without_grace_cancels_at_once(backend):
    backend.start(Placement("s4", "echo started; sleep 300", {"node1": (1,)}, "H100"))
    _log(backend, "s4", "started")
    t0 = time.monotonic()
    backend.stop("s4", 0.0)
    _wait(backend, lambda ev: _of(ev, JobStopped, "s4"))
    assert time.monotonic() - t0 < 15


def test_failing_job_is_reported_failed_with_its_exit_code(backend):
    backend.start(Placement("s5", "exit 3", {"node1": (0,)}, "H100"))
    events = _wait(backend, lambda ev: _of(ev, JobFailed, "s5"))
    assert _of(events, JobFailed, "s5")[0].exit_code == 3


def test_gang_with_different_counts_per_node_runs_as_one_heterogeneous_job(backend):
    placement = Placement(
        "s6", "echo CVD=$CUDA_VISIBLE_DEVICES", {"node1": (0,), "node2": (0, 1, 2)}, "H100"
    )
    backend.start(placement)
    events = _wait(backend, lambda ev: _of(ev, JobFinished, "s6"))
    assert not _of(events, JobFailed)
    assert "CVD=" in _log(backend, "s6", "CVD=")


def test_drained_node_is_reported_down_with_slurms_reason_and_up_after_resume(backend, slurm_conf):
    _wait(backend, lambda ev: {e.node for e in _of(ev, NodeUp)} >= {"node1", "node2"})
    try:
        _slurm(
            slurm_conf,
            "scontrol",
            "update",
            "nodename=node2",
            "state=drain",
            "reason=arbiter-test-xid-79",
        )
        down = _of(_wait(backend, lambda ev: _of(ev, NodeDown)), NodeDown)
        assert [d.node for d in down] == ["node2"]
        assert "arbiter-test-xid-79" in down[0].reason and down[0].reason.startswith("slurm:")
    finally:
        _slurm(slurm_conf, "scontrol", "update", "nodename=node2", "state=resume")
    up = _of(_wait(backend, lambda ev: _of(ev, NodeUp)), NodeUp)
    assert [u.node for u in up] == ["node2"]
    assert [n.name for n in backend.inventory()] == ["node1", "node2"]


def test_new_backend_adopts_the_jobs_slurm_still_runs(backend, tmp_path, slurm_conf):
    backend.start(Placement("s7", "sleep 300", {"node2": (0,)}, "H100"))
    again = SlurmBackend(
        tmp_path / "jobs", partition="gpu", poll_interval_s=0.2, slurm_conf=slurm_conf, **ROOT
    )
    assert "s7" in {r.job_id for r in again.running()}
    again.stop("s7", 0.0)
    _wait(again, lambda ev: _of(ev, JobStopped, "s7"))


def test_serve_with_slurm_backend_runs_a_submitted_job_on_the_gpus_it_reports(
    slurm_conf, tmp_path, monkeypatch
):
    monkeypatch.setenv("SLURM_CONF", slurm_conf)
    server = ServerProcess(
        str(tmp_path / "a.db"),
        tmp_path / "state",
        "admin-tok",
        extra=["--backend", "slurm", "--slurm-partition", "gpu", "--allow-root-jobs"],
    )
    server.start()
    try:
        with server.client() as c:
            deadline = time.monotonic() + 30
            while c.get("/healthz").json()["nodes"] < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
            c.put("/v1/teams/research", json={"quota": {"H100": 16}}).raise_for_status()
            body = {
                "team": "research",
                "command": "echo CVD=$CUDA_VISIBLE_DEVICES; sleep 6",
                "gpus": 3,
            }
            job_id = c.post("/v1/jobs", json=body).json()["id"]
            seen: list[dict] = []
            _wait_job(c, job_id, lambda j: seen.append(j) or j["state"] == "completed")
            log = c.get(f"/v1/jobs/{job_id}/log").text
        running = [j["allocation"] for j in seen if j["state"] == "running"]
        ((node, gpus),) = running[-1]["nodes"].items()  # as recorded once Slurm had placed it
        assert f"CVD={','.join(str(g) for g in gpus)}" in log, (running, log)
    finally:
        server.stop()


def _wait_job(c: httpx.Client, job_id: str, until: Callable[[dict], bool]) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        job = c.get(f"/v1/jobs/{job_id}").json()
        if until(job):
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} stuck: {job}")
