"""Whose Slurm jobs are Arbiter's and what shape they have: the settings of `slurm-config`.

Slurm's accounting (`sacct`, `sreport`) and its limits work per user and per account, so each
team's jobs carry the team's `--account`; the Slurm user is the team's `run_as` (the same
setting the local backend uses). CPUs and memory follow the GPUs (`--cpus-per-gpu`,
`--mem-per-gpu`): without them every job gets one CPU and `DefMemPerCPU`. A team's value wins
over the partition-wide one; the extra sbatch arguments of both are passed, the partition's
first, each one option with its value (`--constraint=ib`). `--time` is a job's walltime
estimate plus `time-margin` seconds (none without an estimate), so Slurm's own limits and
backfill see the end the user announced.

Arbiter counts every GPU of its partition as its own: `foreign-jobs` says whether a job it did
not submit there is a warning at start (`warn`) or stops the service (`refuse`).

The file (TOML, keys as in the example):

    cpus-per-gpu = 8
    mem-per-gpu = "64G"
    extra-sbatch-args = ["--qos=arbiter"]
    time-margin = 600
    foreign-jobs = "refuse"

    [teams.vision]
    account = "vision"
    cpus-per-gpu = 16
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpu_arbiter.domain import InvalidInput

# Slurm's account names: no spaces, commas or control characters (sacctmgr's own rule is
# stricter per site; Slurm refuses the rest with its own error).
ACCOUNT_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"
# `--mem-per-gpu`'s form: a number of megabytes or one with a K/M/G/T suffix.
MEMORY_PATTERN = r"^[1-9][0-9]{0,9}[KMGT]?$"


def _key(name: str) -> str:
    return name.replace("_", "-")


class JobShape(BaseModel):
    """The settings a team may give for itself, each falling back on the partition's."""

    model_config = ConfigDict(extra="forbid", alias_generator=_key, populate_by_name=True)

    account: Annotated[str, Field(pattern=ACCOUNT_PATTERN)] | None = None
    cpus_per_gpu: Annotated[int, Field(ge=1, le=4096, strict=True)] | None = None
    mem_per_gpu: Annotated[str, Field(pattern=MEMORY_PATTERN)] | None = None
    extra_sbatch_args: tuple[str, ...] = ()

    @field_validator("extra_sbatch_args")
    @classmethod
    def _one_argument_each(cls, args: tuple[str, ...]) -> tuple[str, ...]:
        for arg in args:
            if not arg or "\n" in arg or "\r" in arg or "\0" in arg:
                raise ValueError(f"each argument must be one non-empty line, got {arg!r}")
            if not arg.startswith("-"):
                # A bare word would be taken for the batch script's path.
                raise ValueError(f"each argument must be an option (--name=value), got {arg!r}")
        return args


class SlurmSettings(JobShape):
    """The partition-wide settings, and the teams' own under `[teams.NAME]`."""

    time_margin: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 600.0
    foreign_jobs: Literal["warn", "refuse"] = "warn"
    teams: dict[str, JobShape] = {}

    def shape(self, team: str) -> Shape:
        """What a job of `team` is submitted with."""
        own = self.teams.get(team, JobShape())
        return Shape(
            account=own.account or self.account,
            cpus_per_gpu=own.cpus_per_gpu or self.cpus_per_gpu,
            mem_per_gpu=own.mem_per_gpu or self.mem_per_gpu,
            extra_sbatch_args=self.extra_sbatch_args + own.extra_sbatch_args,
        )


@dataclass(frozen=True, slots=True)
class Shape:
    account: str | None
    cpus_per_gpu: int | None
    mem_per_gpu: str | None
    extra_sbatch_args: tuple[str, ...]


def load(path: Path) -> SlurmSettings:
    """The settings in `path`; one line naming the key when the file or a value is bad."""
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as e:
        raise InvalidInput(f"slurm-config {path}: cannot read it ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise InvalidInput(f"slurm-config {path}: not valid TOML: {e}") from None
    try:
        return SlurmSettings.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise InvalidInput(f"slurm-config {path}: {where}: {err['msg']}") from None
