"""`arbiter serve --config FILE`: every option of `serve` in one TOML file.

The file's keys are the command-line options without their dashes (`tier2-grace = 3600` for
`--tier2-grace 3600`), all at the top level. An option given on the command line (or through
its environment variable) wins over the file, and the file over the built-in default. Relative
paths in the file are relative to the file's folder, so a service unit finds the same files
from any working directory.

`ServeConfig` is the one description of the options: it validates the merged values (an error
names the key and where it came from, in one line) and `reference_markdown` renders
docs/configuration.md from it (`arbiter serve --print-config-reference`).
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpu_arbiter.domain import InvalidInput

# Options that are about the command itself, not the service it runs.
NOT_CONFIG = {"config", "print_config_reference"}
# Options given as paths: relative ones in the file are taken from the file's folder.
PATHS = {"state_dir", "reports", "kubeconfig", "slurm_config", "jobs_root"}


def _key(name: str) -> str:
    return name.replace("_", "-")


class ServeConfig(BaseModel):
    """The options of `arbiter serve`."""

    model_config = ConfigDict(
        extra="forbid", alias_generator=_key, populate_by_name=True, frozen=True
    )

    db: str = Field(
        "arbiter.db",
        description="The database: a SQLite file path, `sqlite:///PATH` or "
        "`postgresql://user@host/dbname` (needs the `postgres` extra).",
    )
    host: str = Field("127.0.0.1", description="Address the API and dashboard listen on.")
    port: int = Field(8080, ge=1, le=65535, description="Port the API and dashboard listen on.")
    state_dir: Path = Field(
        Path("arbiter-state"),
        description="Folder for job logs, process state, checkpoints and `admin.token`.",
    )
    admin_token: str | None = Field(
        None,
        description="The admin token. Unset: one is created on a fresh database, written to "
        "STATE_DIR/admin.token and printed once. Environment: `ARBITER_ADMIN_TOKEN`.",
    )
    policy: str = Field("arbiter", description="Scheduling policy (see `arbiter bench`).")
    tier2_grace: float = Field(
        7200.0, ge=0, description="Seconds of notice a tier-2 job gets before it is preempted."
    )
    min_grace: float = Field(
        5.0, ge=0, description="Seconds between SIGTERM and SIGKILL at the least."
    )
    heartbeat_timeout: float = Field(
        30.0, gt=0, description="Seconds without a heartbeat before a node counts as down."
    )
    hot_spares: int = Field(
        0,
        ge=0,
        description="Healthy, empty nodes of each GPU type held back for the jobs a node "
        "failure displaces, which restart on them first (F2).",
    )
    cycle_interval: float = Field(
        0.2, ge=0, description="Least seconds between two scheduling cycles."
    )
    public_url: str | None = Field(
        None,
        description="URL jobs and agents use to reach the API. Unset: `http://HOST:PORT`.",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "warning", description="Least severity of the log lines written to stderr."
    )
    reports: Path | None = Field(
        None, description="Folder of `arbiter bench --out` results the dashboard shows."
    )
    backend: Literal["local", "slurm", "kubernetes"] = Field(
        "local", description="Executor: local processes, Slurm jobs or Kubernetes pods."
    )
    slurm_partition: str | None = Field(
        None, description="Slurm partition Arbiter owns (backend `slurm`)."
    )
    slurm_config: Path | None = Field(
        None,
        description="TOML file of the teams' Slurm accounts, CPUs, memory and extra sbatch "
        "arguments per GPU, the `--time` margin and what to do about jobs Arbiter did not "
        "submit (backend `slurm`; docs/deployment.md).",
    )
    kubeconfig: str | None = Field(
        None,
        description="kubeconfig file (backend `kubernetes`). Unset: the in-cluster "
        "configuration, then ~/.kube/config.",
    )
    namespace: str = Field(
        "arbiter", description="Kubernetes namespace for job pods (backend `kubernetes`)."
    )
    image: str = Field(
        "python:3.11-slim",
        description="Container image job pods run their command in (backend `kubernetes`).",
    )
    straggler_factor: float = Field(
        1.5,
        gt=1,
        allow_inf_nan=False,
        description="A node whose ranks' step time is this many times the median of the other "
        "nodes' ranks in a gang is a straggler (docs/failures.md).",
    )
    straggler_window: float = Field(
        300.0,
        ge=0,
        allow_inf_nan=False,
        description="Seconds a node must stay a straggler to be marked degraded: it takes no "
        "new work and the gang restarts without it.",
    )
    io_stall_window: float = Field(
        600.0,
        ge=0,
        allow_inf_nan=False,
        description="Seconds a job's reported I/O wait must stay above 15 % for its I/O-stall "
        "circuit breaker to trip (docs/failures.md).",
    )
    standby: bool = Field(
        False,
        description="When another serve holds the state dir or the database, wait and take "
        "over when it is gone instead of refusing (docs/deployment.md).",
    )
    jobs_root: Path | None = Field(
        None,
        description="Folder of the jobs' working directories, one per job, outside the state "
        "dir (backend `local`). Unset: `STATE_DIR-work` beside the state dir.",
    )
    allow_root_jobs: bool = Field(
        False,
        description="Run team jobs as root when the server runs as root and the team names no "
        "`run_as` user. Unset, such jobs are refused: a root job reads the server's database "
        "and tokens (docs/deployment.md).",
    )
    public_metrics: bool = Field(
        False,
        description="Show the per-team series (spend, burn rate) on /metrics without a token.",
    )
    auth_failures_per_minute: int = Field(
        30,
        ge=1,
        description="Failed authentications one client address may make in a minute; "
        "then it is answered 429 with Retry-After.",
    )

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, name: str) -> str:
        from gpu_arbiter.engine.policies import POLICIES

        if name not in POLICIES:
            raise ValueError(f"unknown policy {name!r}: use one of {', '.join(POLICIES)}")
        return name


def read_file(path: Path) -> dict[str, Any]:
    """The file's settings by field name, relative paths made relative to its folder."""
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as e:
        raise InvalidInput(f"--config {path}: cannot read it ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise InvalidInput(f"{path}: not valid TOML: {e}") from None
    fields = ServeConfig.model_fields
    out: dict[str, Any] = {}
    for key, value in doc.items():
        name = key.replace("-", "_")
        if name not in fields or name in NOT_CONFIG or key != _key(name):
            keys = [_key(n) for n in fields]
            near = difflib.get_close_matches(_key(name), keys, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else f"; known keys: {', '.join(keys)}"
            raise InvalidInput(f"{path}: unknown key {key!r}{hint}")
        if isinstance(value, str) and value and _is_relative_path(name, value):
            value = str(path.resolve().parent / value)
        out[name] = value
    return out


def _is_relative_path(name: str, value: str) -> bool:
    if name == "db":
        return "://" not in value and not Path(value).expanduser().is_absolute()
    return name in PATHS and not Path(value).expanduser().is_absolute()


def resolve(config: Path | None, options: Mapping[str, Any], given: set[str]) -> ServeConfig:
    """The options `serve` runs with: `options` (the command line's values, defaults
    included) where they were `given`, the file's elsewhere. One line names the bad key."""
    from_file = read_file(config) if config is not None else {}
    values = {n: v for n, v in options.items() if n in ServeConfig.model_fields}
    for name, value in from_file.items():
        if name not in given:
            values[name] = value
    try:
        return ServeConfig(**values)
    except ValidationError as e:
        err = e.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else ""
        where = (
            f"{config}: {_key(name)}"
            if name in from_file and name not in given
            else (f"--{_key(name)}")
        )
        raise InvalidInput(f"{where}: {err['msg']}") from None


def reference_markdown() -> str:
    """docs/configuration.md: every key, its option, type, default and meaning."""
    lines = [
        "# Configuration of `arbiter serve`",
        "",
        "<!-- Generated from gpu_arbiter.cli.serve_config.ServeConfig by",
        "     `arbiter serve --print-config-reference > docs/configuration.md`; do not edit. -->",
        "",
        "`arbiter serve --config FILE` (or `ARBITER_CONFIG=FILE`) reads its options from a TOML",
        "file. Each key is a command-line option without its leading dashes; all keys sit at the",
        "top level. An option given on the command line, or through its environment variable,",
        "wins over the file, and the file wins over the default. Relative paths in the file are",
        "taken from the file's folder. An unknown key or a bad value stops `serve` with one line",
        "that names the key (exit code 2).",
        "",
        "```toml",
        "# /etc/arbiter/arbiter.toml",
        'db = "postgresql://arbiter@db.internal/arbiter"',
        'host = "0.0.0.0"',
        "port = 8080",
        'state-dir = "/var/lib/arbiter"',
        'public-url = "https://arbiter.internal"',
        "tier2-grace = 3600",
        'log-level = "info"',
        "```",
        "",
        "| key | option | type | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for name, field in ServeConfig.model_fields.items():
        key = _key(name)
        default = "unset" if field.default is None else f"`{_toml(field.default)}`"
        lines.append(
            f"| `{key}` | `--{key}` | {_type_name(field.annotation)} | {default} "
            f"| {field.description} |"
        )
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, str | Path):
        return f'"{value}"'
    return str(value)


def _type_name(annotation: Any) -> str:
    text = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "path"}
    args = getattr(annotation, "__args__", None)
    if getattr(annotation, "__origin__", None) is Literal:
        return " \\| ".join(f'`"{a}"`' for a in args)
    if args:  # X | None
        return " \\| ".join(text[a] for a in args if a is not type(None))
    return text[annotation]
