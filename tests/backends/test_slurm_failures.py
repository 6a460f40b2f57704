"""Failures on the real (single-host) test Slurm: a node set down under a job, a job ignoring its
notice while Slurm's KillWait is longer than its grace, and a control plane that restarts after
its jobs ended (docs/failures.md). Every node state changed here is restored after the test."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpu_arbiter.backends.base import Placement
from gpu_arbiter.backends.slurm import SlurmBackend, parse_sacct, slurm_time
from gpu_arbiter.control.launch import ServerProcess
from gpu_arbiter.domain import JobFinished, JobStopped
from gpu_arbiter.domain.events import JobFailed, JobLaunchFailed, JobLost
from tests.backends.test_slurm import ROOT, _log, _of, _slurm, _wait
from tests.control.harness import wait_for

# -- parsing, no Slurm needed ----------------------------------------------------------------


def test_sacct_answers_with_the_newest_run_submitted_since_the_question():
    text = (
        "40|CANCELLED by 0|0:15|2026-12-07T10:00:00|2026-12-07T10:05:00\n"
        "52|NODE_FAIL|0:0|2026-12-07T11:00:00|2026-12-07T11:30:00\n"
        "51|COMPLETED|0:0|2026-12-07T11:00:00|2026-12-07T11:10:00\n"
    )

    def ended(job_id: str, state: str, code: int, end: float) -> tuple:
        return (job_id, state, code, time.strftime("%H:%M", time.localtime(end)))

    since = time.mktime(time.strptime("2026-12-07T10:59:59", "%Y-%m-%dT%H:%M:%S"))
    assert parse_sacct("j1", text, since, ended) == ("j1", "NODE_FAIL", 0, "11:30")
    assert parse_sacct("j1", text, since + 7200, ended) is None


# -- against the real test Slurm -------------------------------------------------------------


@pytest.fixture
def backend(slurm_conf: str, tmp_path: Path) -> Iterator[SlurmBackend]:
    b = SlurmBackend(
        tmp_path / "jobs", partition="gpu", poll_interval_s=0.2, slurm_conf=slurm_conf, **ROOT
    )
    yield b
    for job_id in list(b._jobs):
        b.stop(job_id, 0.0)


def _resume(conf: str, node: str) -> None:
    """Back to service (ReturnToService may have done it already), and wait until it is."""
    env = {**os.environ, "SLURM_CONF": conf}
    subprocess.run(
        ["scontrol", "update", f"nodename={node}", "state=resume"],
        env=env,
        capture_output=True,
        check=False,
    )
    wait_for(
        lambda: (
            re.search(r"idle|mixed|allocated", _slurm(conf, "sinfo", "-h", "-n", node, "-o", "%T"))
            and "drain" not in _slurm(conf, "sinfo", "-h", "-n", node, "-o", "%T")
        ),
        timeout_s=60,
    )


def test_a_job_whose_node_is_set_down_is_lost_not_failed_though_the_node_returns_at_once(
    backend, slurm_conf
):
    backend.start(Placement("f1", "echo started; sleep 300", {"node1": (0,)}, "H100"))
    _log(backend, "f1", "started")
    try:
        _slurm(slurm_conf, "scontrol", "update", "nodename=node1", "state=down", "reason=arbiter-t")
        events = _wait(backend, lambda ev: _of(ev, JobLost, "f1") or _of(ev, JobFailed, "f1"))
    finally:
        _resume(slurm_conf, "node1")
    assert not _of(events, JobFailed), events
    assert "NODE_FAIL" in _of(events, JobLost, "f1")[0].reason


def _deaf(beat) -> str:
    """A job that ignores SIGTERM and writes the time to `beat` every 0.1 s (written aside and
    renamed, so a kill mid-write never leaves the file empty)."""
    tick = f"date +%s.%N > {beat}.tmp; mv {beat}.tmp {beat}"
    return f"trap '' TERM; echo started; while :; do {tick}; sleep 0.1; done"


def test_a_job_ignoring_its_notice_is_killed_at_its_deadline_not_killwait_later(
    backend, slurm_conf, tmp_path
):
    killwait = int(
        re.search(r"KillWait\s*=\s*(\d+)", _slurm(slurm_conf, "scontrol", "show", "config"))[1]
    )
    grace = 5.0
    assert killwait >= 30 > grace  # the case that made a 60 s grace 90 s
    beat = tmp_path / "beat"  # the job's last sign of life
    command = _deaf(beat)
    backend.poll_interval_s = 2.0  # as serve polls: most polls only check deadlines
    backend.start(Placement("f2", command, {"node2": (0,)}, "H100"))
    _log(backend, "f2", "started")
    noticed = time.time()
    backend.stop("f2", grace)
    _wait(backend, lambda ev: _of(ev, JobStopped, "f2"), timeout_s=killwait + 30)
    last = float(beat.read_text())
    assert noticed + grace - 1.5 <= last <= noticed + grace + 5.0, last - noticed


def test_a_backend_restarted_within_a_grace_still_kills_the_job_at_its_deadline(
    backend, slurm_conf, tmp_path
):
    grace = 4.0
    beat = tmp_path / "beat"
    command = _deaf(beat)
    backend.start(Placement("f6", command, {"node2": (1,)}, "H100"))
    _log(backend, "f6", "started")
    noticed = time.time()
    backend.stop("f6", grace)
    backend.shutdown()  # the control plane restarts during the grace
    again = SlurmBackend(
        backend.dir, partition="gpu", poll_interval_s=2.0, slurm_conf=slurm_conf, **ROOT
    )
    try:
        assert "f6" not in {r.job_id for r in again.running()}  # being stopped, not running
        _wait(again, lambda ev: _of(ev, JobStopped, "f6"), timeout_s=60)
    finally:
        again.stop("f6", 0.0)
    last = float(beat.read_text())
    assert noticed + grace - 1.5 <= last <= noticed + grace + 5.0, last - noticed


def test_a_new_backend_tells_how_jobs_that_ended_unwatched_ended(backend, slurm_conf):
    since = time.time()
    backend.start(Placement("f3", "exit 3", {"node1": (1,)}, "H100"))
    backend.start(Placement("f4", "true", {"node1": (2,)}, "H100"))

    def gone() -> bool:
        names = _slurm(slurm_conf, "squeue", "-h", "-o", "%j")
        return "arbiter-f3" not in names and "arbiter-f4" not in names

    wait_for(gone, timeout_s=30)
    backend.shutdown()  # the control plane died before it saw either end
    again = SlurmBackend(backend.dir, partition="gpu", slurm_conf=slurm_conf, **ROOT)
    assert not {"f3", "f4"} & {r.job_id for r in again.running()}
    failed, done = again.outcome("f3", since), again.outcome("f4", since)
    assert isinstance(failed, JobFailed) and failed.exit_code == 3, failed
    assert isinstance(done, JobFinished), done
    assert since - 1 <= failed.at <= time.time() and since - 1 <= done.at <= time.time()
    assert again.outcome("f3", time.time() + 5) is None  # not the run a later start asks about
    assert (backend.files / "f3.exit").read_text().split()[0] == "3"  # the exit record


def test_a_job_cannot_shorten_its_bill_through_its_exit_record(backend, slurm_conf):
    """The exit record is the job's own file: a job that writes an earlier end into it and
    ends its wrapper so that the record stays gets Slurm's end while Slurm remembers the job
    (`scontrol`) and after it has forgotten it (the job completion log, `sacct -c`); with only
    the record left, its end is never before the record last changed, nor before the server
    last knew the job running, nor after now."""
    since = time.time()
    record = backend.files / "f7.exit"
    lie = f"sleep 3; echo '0 {since:.0f}' > {record}; kill -KILL $PPID"
    backend.start(Placement("f7", lie, {"node1": (3,)}, "H100"))
    wait_for(lambda: "arbiter-f7" not in _slurm(slurm_conf, "squeue", "-h", "-o", "%j"))
    assert float(record.read_text().split()[1]) < since + 1  # the lie is in place
    written = record.stat().st_ctime
    backend.shutdown()
    again = SlurmBackend(backend.dir, partition="gpu", slurm_conf=slurm_conf, **ROOT)

    by_slurm = again.outcome("f7", since)
    assert isinstance(by_slurm, JobFailed) and by_slurm.exit_code == -9, by_slurm
    assert since + 2 <= by_slurm.at <= time.time()
    again._outcome_scontrol = lambda job_id, since: None  # Slurm has forgotten the job
    assert again.outcome("f7", since) == by_slurm  # from its completion log

    again._outcome_jobcomp = lambda job_id, since: None  # and keeps no completion log
    only_record = again.outcome("f7", since)
    assert isinstance(only_record, JobFinished) and only_record.at == written
    time.sleep(max(0.0, written + 1.0 - time.time()))  # "known running" must lie in the past
    assert again.outcome("f7", since, alive_at=written + 0.5).at == written + 0.5
    assert again.outcome("f7", since, alive_at=time.time() + 3600).at <= time.time()


def test_a_job_sbatch_refuses_is_a_launch_failure_with_slurms_error(backend):
    backend.start(Placement("f5", "true", {"no-such-node": (0,)}, "H100"))
    (failed,) = _of(backend.poll(), JobLaunchFailed)
    assert failed.job_id == "f5"
    assert "sbatch" in failed.reason and "no-such-node" in failed.reason.lower()
    assert backend.running() == []


def test_a_program_missing_on_the_node_is_a_launch_failure_and_a_real_exit_127_is_not(
    backend, tmp_path
):
    plain = tmp_path / "plain.sh"  # there, but not executable
    plain.write_text("#!/bin/sh\necho ran\n")
    plain.chmod(0o644)
    # A program that starts and exits 127 is a failed run (l3), even when it writes the launch
    # record and sends its batch wrapper the launch-failure signal first to pass as one (l4).
    forged = backend._launch_record("l4")
    forge = f"trap '' USR1; echo forged > {forged}; kill -s USR1 0; exit 127"
    for job_id, command, gpu in (
        ("l1", "no-such-program-arbiter --train", 3),
        ("l2", f"{plain} --train", 4),
        ("l3", "sh -c 'echo started; exit 127'", 5),
        ("l4", forge, 6),
    ):
        backend.start(Placement(job_id, command, {"node1": (gpu,)}, "H100"))
    done = {"l1", "l2", "l3", "l4"}
    ends = (JobLaunchFailed, JobFailed, JobFinished)
    events = _wait(backend, lambda ev: {e.job_id for e in ev if isinstance(e, ends)} >= done)
    missing, unrunnable = _of(events, JobLaunchFailed, "l1"), _of(events, JobLaunchFailed, "l2")
    assert [e.reason for e in missing] == ["no-such-program-arbiter: not found"], events
    assert [e.reason for e in unrunnable] == [f"{plain}: not found or not executable"], events
    for job_id in ("l3", "l4"):
        assert [e.exit_code for e in _of(events, JobFailed, job_id)] == [127], events
    assert forged.read_text().strip() == "forged"
    assert (
        "could not start: no-such-program-arbiter: not found" in backend.log_path("l1").read_text()
    )


# -- serve on Slurm --------------------------------------------------------------------------


@pytest.fixture
def slurm_serve(slurm_conf, tmp_path, monkeypatch) -> Iterator[list[ServerProcess]]:
    """`arbiter serve --backend slurm` servers; afterwards they are stopped and every Slurm job
    they submitted is cancelled."""
    monkeypatch.setenv("SLURM_CONF", slurm_conf)
    started: list[ServerProcess] = []
    yield started
    for s in started:
        s.stop()  # a clean stop lets an sbatch in flight finish, so its job is listed below
        s.kill()
    for line in _slurm(slurm_conf, "squeue", "-h", "-o", "%i|%j").splitlines():
        sid, _, name = line.partition("|")
        if name.startswith("arbiter-") and name[8:] in _submitted(started):
            subprocess.run(["scancel", sid], env={**os.environ, "SLURM_CONF": slurm_conf})


def _submitted(servers: list[ServerProcess]) -> set[str]:
    return {p.name.removesuffix(".log") for s in servers for p in _files(s.state_dir).glob("*.log")}


def _files(state_dir: Path) -> Path:
    """Where serve's Slurm backend keeps Slurm's files of each job: the default jobs root's."""
    return state_dir.with_name(state_dir.name + "-work") / ".slurm"


def _serve(tmp_path: Path, servers: list[ServerProcess]) -> httpx.Client:
    server = ServerProcess(
        str(tmp_path / "a.db"),
        tmp_path / "state",
        "admin-tok",
        extra=["--backend", "slurm", "--slurm-partition", "gpu", "--allow-root-jobs"],
    )
    servers.append(server)
    server.start()
    c = server.client()
    wait_for(lambda: c.get("/healthz").json()["nodes"] >= 2, timeout_s=60)
    return c


def _job(c: httpx.Client, job_id: str) -> dict:
    return c.get(f"/v1/jobs/{job_id}").json()


def _state_of(conf: str, c: httpx.Client, job_id: str, server: ServerProcess) -> str:
    """What the server and Slurm say of a job a test waited on in vain: the job, Slurm's runs of
    it and the nodes' states, and the end of the server's log."""
    runs = _slurm(
        conf, "squeue", "-h", "-t", "all", "--name", f"arbiter-{job_id}", "-o", "%i %T %R"
    )
    nodes = _slurm(conf, "sinfo", "-N", "-h", "-o", "%N %T %E")
    log = server.log()[-3000:]
    return f"job {_job(c, job_id)}; Slurm runs: {runs!r}; nodes: {nodes!r}; log: {log}"


def test_serve_requeues_a_job_whose_node_slurm_set_down_from_its_checkpoint(
    slurm_conf, tmp_path, slurm_serve
):
    c = _serve(tmp_path, slurm_serve)
    c.put("/v1/teams/research", json={"quota": {"H100": 16}}).raise_for_status()
    body = {"team": "research", "command": "sleep 300", "gpus": 8, "tier": 1}
    job_id = c.post("/v1/jobs", json=body).json()["id"]
    job = wait_for(lambda: (j := _job(c, job_id))["state"] == "running" and j)
    (node,) = job["allocation"]["nodes"]
    # Until Slurm runs it, a node set down and back at once (ReturnToService) costs the job
    # nothing, and a poll may never see the node down: only a running job is lost.
    name = f"arbiter-{job_id}"
    wait_for(lambda: "RUNNING" in _slurm(slurm_conf, "squeue", "-h", "--name", name, "-o", "%T"))
    r = c.post(f"/v1/jobs/{job_id}/telemetry", json={"event": "checkpoint", "step": 10})
    checkpoint_at = r.json()["at"]
    try:
        _slurm(slurm_conf, "scontrol", "update", f"nodename={node}", "state=down", "reason=t")
        job = wait_for(
            lambda: (j := _job(c, job_id))["restarts"] == 1 and j,
            timeout_s=90,
            explain=lambda: _state_of(slurm_conf, c, job_id, slurm_serve[-1]),
        )
    finally:
        _resume(slurm_conf, node)
    assert job["state"] in ("pending", "running") and job["tier"] == 1, job
    assert "node failure" in job["reason"] or job["state"] == "running"
    ledger = c.get("/v1/ledger", params={"limit": 1000}).json()
    lost = [e for e in ledger if e.get("job_id") == job_id and e["reason"] == "lost-work"]
    assert len(lost) == 1 and lost[0]["start"] == pytest.approx(checkpoint_at)
    assert not [e for e in ledger if e.get("job_id") == job_id and e["reason"] == "rerun"]


def test_serve_killed_while_a_slurm_job_ends_records_it_at_its_end_and_never_resubmits_it(
    slurm_conf, tmp_path, slurm_serve
):
    c = _serve(tmp_path, slurm_serve)
    c.put("/v1/teams/research", json={"quota": {"H100": 16}}).raise_for_status()
    body = {"team": "research", "command": "sleep 3", "gpus": 1}
    job_id = c.post("/v1/jobs", json=body).json()["id"]
    wait_for(lambda: _job(c, job_id)["state"] == "running")
    wait_for((_files(tmp_path / "state") / f"{job_id}.log").exists)  # sbatch went through
    slurm_serve[-1].kill()
    c.close()
    record = _files(tmp_path / "state") / f"{job_id}.exit"
    wait_for(record.exists, timeout_s=30)
    ended = float(record.read_text().split()[1])
    wait_for(lambda: f"arbiter-{job_id}" not in _slurm(slurm_conf, "squeue", "-h", "-o", "%j"))

    c = _serve(tmp_path, slurm_serve)
    job = wait_for(lambda: (j := _job(c, job_id))["state"] != "running" and j)
    assert job["state"] == "completed" and job["restarts"] == 0, job
    assert ended - 1 <= job["finished_at"] <= ended + 1  # Slurm's times are whole seconds
    # Submitted once, never again (Slurm still lists earlier tests' jobs of the same name).
    runs = _slurm(
        slurm_conf, "squeue", "-h", "-t", "all", "--name", f"arbiter-{job_id}", "-o", "%V"
    )
    assert len([t for t in runs.split() if slurm_time(t) >= job["submitted_at"] - 1]) == 1, runs
    charges = [
        e
        for e in c.get("/v1/ledger", params={"limit": 1000}).json()
        if e.get("job_id") == job_id and e["kind"] == "charge"
    ]
    assert len(charges) == 1 and charges[0]["end"] <= ended + 1


def test_serve_fails_a_slurm_job_whose_program_is_missing_on_its_node_and_charges_nothing(
    slurm_conf, tmp_path, slurm_serve
):
    c = _serve(tmp_path, slurm_serve)
    c.put("/v1/teams/launch", json={"quota": {"H100": 16}}).raise_for_status()
    body = {"team": "launch", "command": "no-such-program-arbiter --train", "gpus": 16}
    bad = c.post("/v1/jobs", json=body).json()["id"]
    # Both nodes' GPUs: this one starts only once the failed job has released them.
    body = {"team": "launch", "command": "sh -c 'sleep 1; exit 127'", "gpus": 16}
    ran = c.post("/v1/jobs", json=body).json()["id"]
    failed = wait_for(lambda: (j := _job(c, bad))["state"] == "failed" and j, timeout_s=30)
    assert failed["reason"] == "could not start: no-such-program-arbiter: not found", failed
    exited = wait_for(lambda: (j := _job(c, ran))["state"] == "failed" and j, timeout_s=30)
    assert exited["reason"] == "exited with code 127" and exited["exit_code"] == 127, exited
    ledger = c.get("/v1/ledger", params={"limit": 1000}).json()
    assert not [e for e in ledger if e.get("job_id") == bad]
    charged = [e for e in ledger if e.get("job_id") == ran and e["kind"] == "charge"]
    assert charged, ledger
    (bill,) = [b for b in c.get("/v1/bill").json() if b["team"] == "launch"]
    assert bill["credits_spent"] == pytest.approx(sum(e["credits"] for e in charged)), bill


def test_serve_requeues_a_job_whose_slurmd_is_lost_and_it_finishes_on_the_other_node(
    slurm_conf, tmp_path, slurm_serve
):
    config = _slurm(slurm_conf, "scontrol", "show", "config")
    timeout = int(re.search(r"SlurmdTimeout\s*=\s*(\d+)", config)[1])
    if timeout > 30:
        pytest.skip(f"the test Slurm's SlurmdTimeout is {timeout} s: too long to wait for")
    c = _serve(tmp_path, slurm_serve)
    c.put("/v1/teams/research", json={"quota": {"H100": 16}}).raise_for_status()
    # Its second run finds what the first left in its working directory, and ends.
    command = "test -e resumed && exit 0; touch resumed; echo started; sleep 300"
    body = {"team": "research", "command": command, "gpus": 8, "tier": 1}
    job_id = c.post("/v1/jobs", json=body).json()["id"]
    job = wait_for(lambda: (j := _job(c, job_id))["state"] == "running" and j)
    (node,) = job["allocation"]["nodes"]
    log = _files(tmp_path / "state") / f"{job_id}.log"
    wait_for(lambda: log.exists() and "started" in log.read_text())
    c.post(f"/v1/jobs/{job_id}/telemetry", json={"event": "checkpoint", "step": 10})
    pidfile = Path(slurm_conf).parents[1] / f"slurmd-{node}.pid"
    try:
        os.kill(int(pidfile.read_text()), signal.SIGKILL)  # the node's slurmd is lost
        job = wait_for(
            lambda: (j := _job(c, job_id))["state"] == "completed" and j, timeout_s=timeout * 6
        )
    finally:
        env = {**os.environ, "SLURM_TEST_NODES": "2", "SLURM_CONF": slurm_conf}
        script = Path(__file__).resolve().parents[2] / "scripts" / "slurm-test-cluster.sh"
        subprocess.run([str(script), "start"], env=env, capture_output=True, timeout=120)
        _resume(slurm_conf, node)
    assert job["restarts"] == 1 and job["tier"] == 1, job  # not the job's fault: not demoted
    starts = [
        a["detail"]["allocation"]
        for a in c.get("/v1/audit", params={"limit": 1000}).json()
        if a["action"] == "start" and a["subject"] == job_id
    ]
    assert len(starts) == 2 and node not in starts[1], starts
    requeue = [
        a["detail"]["reason"]
        for a in c.get("/v1/audit", params={"limit": 1000}).json()
        if a["action"] == "requeue" and a["subject"] == job_id
    ]
    assert requeue and node in requeue[0], requeue
    ledger = [
        e for e in c.get("/v1/ledger", params={"limit": 1000}).json() if e.get("job_id") == job_id
    ]
    assert [e["reason"] for e in ledger if e["reason"] in ("lost-work", "rerun")] == ["lost-work"]
