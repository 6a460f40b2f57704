"""The sbatch arguments of a team's job: its account, CPUs, memory and extra arguments per GPU,
`--time` from the walltime estimate, the user it runs as; and the settings file's checks.
No Slurm needed: nothing here submits a job."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from gpu_arbiter.backends.base import Placement
from gpu_arbiter.backends.slurm import SlurmBackend
from gpu_arbiter.backends.slurm_shape import SlurmSettings, load
from gpu_arbiter.domain import InvalidInput
from gpu_arbiter.domain.events import JobLaunchFailed

SETTINGS = {
    "cpus-per-gpu": 4,
    "mem-per-gpu": "16G",
    "extra-sbatch-args": ["--qos=arbiter"],
    "time-margin": 300,
    "teams": {
        "vision": {"account": "vision", "cpus-per-gpu": 8, "extra-sbatch-args": ["--constraint=ib"]}
    },
}


@pytest.fixture(autouse=True)
def _no_slurm_tools(tmp_path, monkeypatch):
    """No Slurm command is found: adopting and the foreign-job check only warn."""
    monkeypatch.setenv("PATH", str(tmp_path))


def _backend(
    tmp_path: Path, settings: dict | None = None, allow_root: bool = False
) -> SlurmBackend:
    settings_ = SlurmSettings.model_validate(settings or {})
    return SlurmBackend(
        tmp_path / "jobs", partition="gpu", settings=settings_, allow_root=allow_root
    )


def _value(args: list[str], option: str) -> list[str]:
    return [a.split("=", 1)[1] for a in args if a.startswith(option + "=")]


def test_team_settings_win_over_the_partitions_and_extra_arguments_add_up(tmp_path):
    b = _backend(tmp_path, SETTINGS)
    p = Placement("j1", "true", {"node1": (0, 1)}, "H100", team="vision", walltime_s=3600)
    args = b._sbatch_args(p)
    assert _value(args, "--account") == ["vision"]
    assert _value(args, "--cpus-per-gpu") == ["8"]
    assert _value(args, "--mem-per-gpu") == ["16G"]  # the partition's: the team gave none
    assert _value(args, "--time") == ["65"]  # (3600 s + 300 s margin) in minutes
    extra = args.index("--qos=arbiter")
    assert args[extra + 1] == "--constraint=ib"


def test_a_team_without_settings_gets_the_partitions_and_no_time_without_an_estimate(tmp_path):
    b = _backend(tmp_path, SETTINGS)
    args = b._sbatch_args(Placement("j2", "true", {"node1": (0,)}, "H100", team="nlp"))
    assert _value(args, "--cpus-per-gpu") == ["4"]
    assert _value(args, "--account") == [] and _value(args, "--time") == []
    assert "--constraint=ib" not in args and "--qos=arbiter" in args


def test_time_rounds_up_to_whole_minutes(tmp_path):
    b = _backend(tmp_path, {"time-margin": 0})
    args = b._sbatch_args(Placement("j3", "true", {"node1": (0,)}, "H100", walltime_s=61))
    assert _value(args, "--time") == ["2"]


def test_each_component_of_a_heterogeneous_job_gets_cpus_and_memory_per_gpu(tmp_path):
    b = _backend(tmp_path, SETTINGS)
    p = Placement("j4", "true", {"node1": (0, 1), "node2": (0,)}, "H100", team="vision")
    args = b._sbatch_args(p)
    assert ":" in args
    assert _value(args, "--cpus-per-gpu") == ["8", "8"]
    assert _value(args, "--mem-per-gpu") == ["16G", "16G"]


def test_a_job_of_another_user_is_submitted_with_its_uid_and_gid(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only root submits as another user")
    nobody = pwd.getpwnam("nobody")
    b = _backend(tmp_path)
    p = Placement("j5", "true", {"node1": (0,)}, "H100", team="vision", run_as="nobody")
    args = b._sbatch_args(p, b._owner(p))
    assert _value(args, "--uid") == [str(nobody.pw_uid)]
    assert _value(args, "--gid") == [str(nobody.pw_gid)]
    assert _value(args, "--chdir") == [str(tmp_path / "jobs-work" / "j5")]
    own = Placement("j6", "true", {"node1": (0,)}, "H100", run_as=pwd.getpwuid(0).pw_name)
    assert _backend(tmp_path, allow_root=True)._owner(own) is None  # its own user: no --uid


@pytest.mark.parametrize("run_as", [None, "root"])
def test_a_team_job_as_root_fails_the_launch_unless_root_jobs_are_allowed(tmp_path, run_as):
    if os.geteuid() != 0:
        pytest.skip("only root can be refused root")
    b = _backend(tmp_path)
    b.start(Placement("j9", "true", {"node1": (0,)}, "H100", team="vision", run_as=run_as))
    [failed] = b.poll()
    assert isinstance(failed, JobLaunchFailed) and "--allow-root-jobs" in failed.reason
    assert not (tmp_path / "jobs-work").exists()  # nothing made for it


def test_an_unknown_user_fails_the_launch_with_one_line_naming_it(tmp_path):
    b = _backend(tmp_path)
    b.start(Placement("j7", "true", {"node1": (0,)}, "H100", team="vision", run_as="no-such-u"))
    [failed] = b.poll()
    assert isinstance(failed, JobLaunchFailed)
    assert "'no-such-u'" in failed.reason and "vision" in failed.reason
    assert "\n" not in failed.reason
    assert not b.log_path("j7").exists()


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        ('extra-sbatch-args = ["--qos=a\\nb"]', "extra-sbatch-args"),
        ('extra-sbatch-args = ["--x\\u0000"]', "extra-sbatch-args"),
        ('extra-sbatch-args = "--qos=a"', "extra-sbatch-args"),
        ('extra-sbatch-args = ["qos"]', "extra-sbatch-args"),
        ("cpus-per-gpu = 0", "cpus-per-gpu"),
        ('mem-per-gpu = "lots"', "mem-per-gpu"),
        ('foreign-jobs = "ignore"', "foreign-jobs"),
        ("time-margin = -1", "time-margin"),
        ('[teams.vision]\naccount = "a b"', "teams.vision.account"),
        ("[teams.vision]\ncpu-per-gpu = 2", "teams.vision.cpu-per-gpu"),
        ("cpus-per-gpu = [", "not valid TOML"),
    ],
)
def test_a_bad_settings_file_is_refused_in_one_line_naming_the_key(tmp_path, doc, where):
    path = tmp_path / "slurm.toml"
    path.write_text(doc + "\n")
    with pytest.raises(InvalidInput) as e:
        load(path)
    assert where in str(e.value) and "\n" not in str(e.value)


def test_the_settings_file_is_read_with_its_teams(tmp_path):
    path = tmp_path / "slurm.toml"
    path.write_text('foreign-jobs = "refuse"\n[teams.vision]\naccount = "vision"\n')
    settings = load(path)
    assert settings.foreign_jobs == "refuse"
    assert settings.shape("vision").account == "vision"


def test_a_user_that_cannot_reach_the_jobs_folder_fails_the_launch_naming_the_folder(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only root submits as another user")
    tmp_path.chmod(0o700)
    b = _backend(tmp_path)
    b.start(Placement("j8", "true", {"node1": (0,)}, "H100", team="vision", run_as="nobody"))
    [failed] = b.poll()
    assert isinstance(failed, JobLaunchFailed)
    assert f"{tmp_path} is closed to it" in failed.reason
    assert not b.log_path("j8").exists()
