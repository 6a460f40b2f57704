"""A team's Slurm jobs run as its user, under its account, with the CPUs, memory and time
limit its settings give; jobs Arbiter did not submit in its partition are reported at start.
Against the real test Slurm (skipped without it)."""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_arbiter.backends.base import Placement
from gpu_arbiter.backends.slurm import SlurmBackend
from gpu_arbiter.backends.slurm_inventory import parse_fields
from gpu_arbiter.backends.slurm_shape import SlurmSettings
from gpu_arbiter.control.launch import ServerProcess
from gpu_arbiter.domain import InvalidInput, JobFinished
from tests.backends.test_slurm import ROOT, _log, _of, _slurm, _wait, _wait_job

USER = "arbiter-t-vision"


@pytest.fixture
def team_user(slurm_conf: str) -> Iterator[pwd.struct_passwd]:
    """A unix user for the team, made for the test and removed after it."""
    subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", USER], check=True)
    try:
        yield pwd.getpwnam(USER)
    finally:
        subprocess.run(["userdel", USER], check=True)


@pytest.fixture
def jobs_dir() -> Iterator[Path]:
    """A jobs folder the team's user can traverse (pytest's own tmp folders are root's 0700)."""
    path = Path(tempfile.mkdtemp(prefix="arbiter-slurm-id-", dir="/tmp"))
    path.chmod(0o711)
    try:
        yield path / "jobs"
    finally:
        shutil.rmtree(path)


def _job(conf: str, b: SlurmBackend, job_id: str) -> dict[str, str]:
    return parse_fields(_slurm(conf, "scontrol", "show", "job", "-o", b.slurm_id(job_id) or ""))


def test_a_teams_job_runs_as_its_user_under_its_account_with_its_shape(
    slurm_conf, team_user, jobs_dir
):
    settings = SlurmSettings.model_validate(
        {
            "time-margin": 600,
            "mem-per-gpu": "500",
            "teams": {"vision": {"account": "vision", "cpus-per-gpu": 2}},
        }
    )
    b = SlurmBackend(
        jobs_dir, partition="gpu", poll_interval_s=0.2, settings=settings, slurm_conf=slurm_conf
    )
    try:
        command = "echo uid=$(id -u); sleep 3"
        placement = Placement(
            "id1", command, {"node1": (0, 1)}, "H100", team="vision", run_as=USER, walltime_s=60
        )
        b.start(placement)
        _log(b, "id1", "uid=")
        job = _job(slurm_conf, b, "id1")
        assert job["UserId"] == f"{USER}({team_user.pw_uid})"
        assert job["Account"] == "vision"
        assert job["TimeLimit"] == "00:11:00"  # 60 s estimate + 600 s margin
        assert job["NumCPUs"] == "4"  # 2 GPUs x 2 CPUs
        assert job["MemPerTres"] == "gres:gpu:500"
        events = _wait(b, lambda ev: _of(ev, JobFinished, "id1"))
        assert _of(events, JobFinished, "id1")
        assert f"uid={team_user.pw_uid}" in b.log_path("id1").read_text()
        assert b.log_path("id1").stat().st_uid == team_user.pw_uid  # the team's file
    finally:
        for job_id in list(b._jobs):
            b.stop(job_id, 0.0)


def test_a_slurm_job_gets_its_users_environment_and_none_of_the_servers(
    slurm_conf, team_user, jobs_dir, monkeypatch
):
    monkeypatch.setenv("ARBITER_ADMIN_TOKEN", "the-servers-secret")  # in serve's environment
    b = SlurmBackend(jobs_dir, partition="gpu", poll_interval_s=0.2, slurm_conf=slurm_conf)
    try:
        placement = Placement(
            "id2", "env", {"node1": (2,)}, "H100", env={"OWN": "mine"}, team="t", run_as=USER
        )
        b.start(placement)
        _wait(b, lambda ev: _of(ev, JobFinished, "id2"))
        lines = b.log_path("id2").read_text().splitlines()
        env = dict(line.split("=", 1) for line in lines if "=" in line)
    finally:
        for job_id in list(b._jobs):
            b.stop(job_id, 0.0)
    assert "the-servers-secret" not in env.values()
    assert (env["HOME"], env["USER"], env["OWN"]) == (team_user.pw_dir, USER, "mine"), env


def test_jobs_arbiter_did_not_submit_in_its_partition_are_a_warning_or_a_refusal(
    slurm_conf, tmp_path, caplog
):
    env = {**os.environ, "SLURM_CONF": slurm_conf}
    sid = subprocess.run(
        ["sbatch", "--parsable", "--partition=gpu", "--job-name=someone-else", "--output=/dev/null"]
        + ["--wrap=sleep 60"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        with caplog.at_level(logging.WARNING, logger="gpu_arbiter.backends.slurm"):
            SlurmBackend(tmp_path / "jobs", partition="gpu", slurm_conf=slurm_conf, **ROOT)
        assert f"{sid} (someone-else" in caplog.text
        refuse = SlurmSettings.model_validate({"foreign-jobs": "refuse"})
        with pytest.raises(InvalidInput, match="did not submit"):
            SlurmBackend(tmp_path / "jobs", partition="gpu", settings=refuse, slurm_conf=slurm_conf)
    finally:
        subprocess.run(["scancel", sid], env=env, check=False)


def test_serve_submits_a_teams_jobs_with_the_account_shape_and_time_of_its_slurm_config(
    slurm_conf, tmp_path, monkeypatch
):
    monkeypatch.setenv("SLURM_CONF", slurm_conf)
    config = tmp_path / "slurm.toml"
    config.write_text('time-margin = 60\n[teams.research]\naccount = "res"\ncpus-per-gpu = 2\n')
    server = ServerProcess(
        str(tmp_path / "a.db"),
        tmp_path / "state",
        "admin-tok",
        extra=["--backend", "slurm", "--slurm-partition", "gpu", "--slurm-config", str(config)]
        + ["--allow-root-jobs"],
    )
    server.start()
    try:
        with server.client() as c:
            deadline = time.monotonic() + 30
            while c.get("/healthz").json()["nodes"] < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
            c.put("/v1/teams/research", json={"quota": {"H100": 16}}).raise_for_status()
            body = {"team": "research", "command": "sleep 60", "gpus": 3, "walltime_s": 120}
            job_id = c.post("/v1/jobs", json=body).json()["id"]
            _wait_job(c, job_id, lambda j: j["state"] == "running")
            ids = _slurm(slurm_conf, "squeue", "-h", "-o", "%i", "-n", f"arbiter-{job_id}")
            job = parse_fields(_slurm(slurm_conf, "scontrol", "show", "job", "-o", ids.split()[0]))
            c.post(f"/v1/jobs/{job_id}/cancel").raise_for_status()
        assert job["Account"] == "res"
        assert job["TimeLimit"] == "00:03:00"  # 120 s estimate + 60 s margin
        assert job["CpusPerTres"] == "gres:gpu:2"  # the job may still be pending
    finally:
        server.stop()


def _slurm_server(tmp_path: Path, jobs_root: Path, *extra: str) -> ServerProcess:
    """`arbiter serve --backend slurm` with its private state under pytest's folder (0700, as
    the server makes it) and the jobs root where the teams' users can reach it."""
    server = ServerProcess(
        str(tmp_path / "a.db"),
        tmp_path / "state",
        "admin-tok",
        extra=["--backend", "slurm", "--slurm-partition", "gpu", "--jobs-root", str(jobs_root)]
        + list(extra),
    )
    server.start()
    with server.client() as c:
        deadline = time.monotonic() + 30
        while c.get("/healthz").json()["nodes"] < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
    return server


def test_serve_runs_a_teams_slurm_job_as_its_user_beside_a_private_state_dir(
    slurm_conf, tmp_path, monkeypatch, team_user, jobs_dir
):
    monkeypatch.setenv("SLURM_CONF", slurm_conf)
    server = _slurm_server(tmp_path, jobs_dir)
    try:
        with server.client() as c:
            team = {"quota": {"H100": 16}, "run_as": USER}
            c.put("/v1/teams/vision", json=team).raise_for_status()
            body = {"team": "vision", "command": "echo uid=$(id -u) cwd=$(pwd)", "gpus": 1}
            job_id = c.post("/v1/jobs", json=body).json()["id"]
            job = _wait_job(c, job_id, lambda j: j["state"] in ("completed", "failed"))
            log = c.get(f"/v1/jobs/{job_id}/log").text
        assert job["state"] == "completed", (job, log)
        assert f"uid={team_user.pw_uid} cwd={jobs_dir / job_id}" in log
        assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
        assert (jobs_dir / job_id).stat().st_uid == team_user.pw_uid  # its own folder
        files = jobs_dir / ".slurm"  # the server's folder: the job cannot swap its files
        assert files.stat().st_uid == 0 and stat.S_IMODE(files.stat().st_mode) == 0o711
    finally:
        server.stop()


def test_serve_refuses_a_slurm_job_of_a_team_without_run_as_unless_root_jobs_are_allowed(
    slurm_conf, tmp_path, monkeypatch, jobs_dir
):
    monkeypatch.setenv("SLURM_CONF", slurm_conf)
    server = _slurm_server(tmp_path, jobs_dir)
    try:
        with server.client() as c:
            c.put("/v1/teams/research", json={"quota": {"H100": 16}}).raise_for_status()
            body = {"team": "research", "command": "true", "gpus": 1}
            job_id = c.post("/v1/jobs", json=body).json()["id"]
            job = _wait_job(c, job_id, lambda j: j["state"] not in ("pending", "running"))
        assert job["state"] == "failed", job
        assert "no run_as user" in job["reason"] and "--allow-root-jobs" in job["reason"]
    finally:
        server.stop()
