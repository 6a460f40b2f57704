"""A team's Slurm jobs run as its user, under its account, with the CPUs, memory and time
limit its settings give; jobs Arbiter did not submit in its partition are reported at start.
Against the real test Slurm (skipped without it)."""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_arbiter.backends.base import Placement
from gpu_arbiter.backends.slurm import SlurmBackend
from gpu_arbiter.backends.slurm_inventory import parse_fields
from gpu_arbiter.backends.slurm_shape import SlurmSettings
from gpu_arbiter.domain import InvalidInput, JobFinished
from tests.backends.test_slurm import _log, _of, _slurm, _wait

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
            SlurmBackend(tmp_path / "jobs", partition="gpu", slurm_conf=slurm_conf)
        assert f"{sid} (someone-else" in caplog.text
        refuse = SlurmSettings.model_validate({"foreign-jobs": "refuse"})
        with pytest.raises(InvalidInput, match="did not submit"):
            SlurmBackend(tmp_path / "jobs", partition="gpu", settings=refuse, slurm_conf=slurm_conf)
    finally:
        subprocess.run(["scancel", sid], env=env, check=False)
