"""The REST contract's request bodies. Pydantic checks every field at the edge, so a bad request
is answered 422 with the field's name before anything is changed.

Strict mode: a JSON `true` or `"2"` is not a number of GPUs, and a number is not a string. One
name rule (`NAME_PATTERN`) holds for teams, nodes, jobs, GPU types and racks, in bodies and in
paths alike, and every integer has bounds the databases can store."""

from __future__ import annotations

import math
import sys
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    HttpUrl,
    PlainValidator,
    WithJsonSchema,
    field_validator,
)

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
NAME_MAX = 64
NODE_NAME_MAX = 128  # host names run longer than team names
# The largest id the databases store (an INTEGER column is 32 bits on PostgreSQL): ids and
# offsets in paths and queries stay within it.
MAX_ID = 2**31 - 1
# A POSIX user name (useradd's default rule), for `run_as`.
USER_PATTERN = r"^[a-z_][a-z0-9_-]{0,31}$"

Name = Annotated[str, Field(min_length=1, max_length=NAME_MAX, pattern=NAME_PATTERN)]
Count = Annotated[int, Field(ge=0, le=1_000_000)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
# What a job may put in its environment: well under what exec accepts (128 KiB per string,
# about 2 MiB for all of them together with the command line), so a job that was queued can
# always be started, with room left for what Arbiter adds.
ENV_MAX_BYTES = 128 * 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class JobSubmit(_Strict):
    """A job request. `team` may be left out with a team token (it is the token's team); an
    admin must name it. `gpu_types` maps accepted types to the job's speed on them (or lists
    them at catalog speed); empty means any type."""

    command: Annotated[str, Field(min_length=1, max_length=16_384)]
    team: Name | None = None
    name: Annotated[str, Field(max_length=128)] = ""
    tier: Literal[1, 2, 3] = 3
    gpus: Annotated[int, Field(ge=1, le=100_000)] = 1
    min_gpus: Annotated[int, Field(ge=1, le=100_000)] | None = None
    max_gpus: Annotated[int, Field(ge=1, le=100_000)] | None = None
    gpu_types: dict[Name, Positive] | list[Name] = Field(default_factory=dict)
    walltime_s: Positive | None = None
    checkpoint_interval_s: Positive | None = None
    max_racks: Annotated[int, Field(ge=1, le=100_000)] | None = None
    tp_size: Annotated[int, Field(ge=1, le=100_000)] = 1
    power_profile: Literal["normal", "high"] = "normal"
    gpu_milli: Annotated[int, Field(ge=1, le=1000)] = 1000
    kind: Literal["training", "inference"] = "training"
    latency_slo_ms: Positive | None = None  # S9, inference only
    justification: Annotated[str, Field(max_length=2000)] | None = None
    data_locality: Name | None = None
    env: dict[Annotated[str, Field(pattern=_ENV_NAME, max_length=128)], str] = Field(
        default_factory=dict
    )
    client_key: Annotated[str, Field(min_length=1, max_length=128)] | None = None

    @field_validator("env")
    @classmethod
    def _no_arbiter_env(cls, env: dict[str, str]) -> dict[str, str]:
        for key in env:
            if key.startswith("ARBITER_") or key == "CUDA_VISIBLE_DEVICES":
                raise ValueError(f"{key} is set by Arbiter and cannot be overridden")
        return env

    @field_validator("env")
    @classmethod
    def _env_fits_exec(cls, env: dict[str, str]) -> dict[str, str]:
        """exec takes NUL-terminated strings of bounded size: a job that could never start is
        refused here rather than failing at launch."""
        size = 0
        for key, value in env.items():
            if "\0" in value:
                raise ValueError(f"{key} contains a NUL byte, which exec cannot pass")
            size += len(key.encode()) + len(value.encode()) + 2
        if size > ENV_MAX_BYTES:
            raise ValueError(f"is {size} bytes; at most {ENV_MAX_BYTES} are accepted")
        return env

    @field_validator("command")
    @classmethod
    def _command_fits_exec(cls, command: str) -> str:
        if "\0" in command:
            raise ValueError("contains a NUL byte, which exec cannot pass")
        return command

    def accepted_types(self) -> dict[str, float]:
        if isinstance(self.gpu_types, list):
            return {}
        return dict(self.gpu_types)


class TeamPut(_Strict):
    """A team. `breaker_policy` says what a tripped circuit breaker does to its jobs (F5):
    `stop` them (their GPUs are released) or `flag` them and let them run; either way the
    team is told, at `webhook_url` too when set (a POST of `{"text": ...}`, the body a Slack
    incoming webhook takes). `run_as` is the unix user the local backend runs its jobs as
    (None: the server's own user, which must not be root unless the server allows root
    jobs)."""

    weight: Positive = 1.0
    quota: dict[Name, Count] = Field(default_factory=dict)
    budget_per_period: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    breaker_policy: Literal["stop", "flag"] = "stop"
    webhook_url: Annotated[HttpUrl, Field(max_length=2000)] | None = None
    run_as: Annotated[str, Field(pattern=USER_PATTERN)] | None = None


class TokenCreate(_Strict):
    role: Literal["team", "agent", "admin"] = "team"
    team: Name | None = None
    label: Annotated[str, Field(max_length=128)] = ""


class NodeRegister(_Strict):
    gpu_type: Name
    gpus: Annotated[int, Field(ge=1, le=64)]
    rack: Name = "rack0"


class Heartbeat(_Strict):
    """A node agent's heartbeat; the health fields follow `reliability.HealthReport`."""

    xids: list[Annotated[int, Field(ge=0, le=1_000_000)]] = Field(
        default_factory=list, max_length=1000
    )
    ecc_uncorrectable: Count = 0
    nvlink_down: Count = 0
    temperature_c: Annotated[float, Field(allow_inf_nan=False)] | None = None
    gpus_seen: Count | None = None


NON_FINITE = ("nan", "inf", "-inf")
_HUGE = sys.float_info.max  # any finite double


def _number(lo: float, hi: float) -> Any:
    """A float that is a plain JSON number in [lo, hi]: never a boolean, a string, NaN,
    Infinity or an overflow such as 1e400 (which JSON parsers read as infinity)."""
    return Annotated[float, Field(strict=True, allow_inf_nan=False, ge=lo, le=hi)]


def _sample(lo: float, hi: float) -> Any:
    """A training metric that may be NaN or infinite, which is exactly what a circuit breaker
    must see: a JSON number in [lo, hi], or the string "nan", "inf" or "-inf". The value is
    kept as sent (a string stays a string), so it can be stored as JSON. The range is wide: a
    diverging loss passes through every magnitude on its way to infinity."""

    def check(value: Any) -> float | str:
        if isinstance(value, str):
            if value in NON_FINITE:
                return value
            raise ValueError(f"must be a number or one of {', '.join(NON_FINITE)} (a string)")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("must be a number")
        # An int is compared as it is: one too large for a float overflows math.isfinite.
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError('must be finite as a JSON number; send "nan", "inf" or "-inf"')
        if not lo <= value <= hi:
            raise ValueError(f"must be between {lo:g} and {hi:g}")
        return float(value)

    schema = {
        "oneOf": [
            {"type": "number", "minimum": lo, "maximum": hi},
            {"type": "string", "enum": list(NON_FINITE)},
        ],
        "description": 'A number, or "nan", "inf" or "-inf" for a non-finite value.',
    }
    return Annotated[float | str, PlainValidator(check), WithJsonSchema(schema)]


def as_float(value: float | str | None) -> float | None:
    """A metric as sent (`_sample`) as a float: "nan" is NaN, "inf" infinity."""
    return None if value is None else float(value)


class Telemetry(_Strict):
    """What a job reports (F4): progress and, after a save, when its checkpoint was taken.

    `loss` and `grad_norm` feed the circuit breakers (F5), so a NaN or infinite value is sent
    as the string "nan", "inf" or "-inf"; every other number is a plain, bounded JSON number.
    A rank of a multi-node job reports its own `step_time_s` with its `rank` and `node`, so a
    node whose ranks hold the gang back is found (stragglers)."""

    step: Annotated[int, Field(strict=True, ge=0, le=2**53)] | None = None
    loss: _sample(-_HUGE, _HUGE) | None = None
    grad_norm: _sample(0.0, _HUGE) | None = None
    tokens_per_s: _number(0.0, 1e13) | None = None
    io_wait_share: _number(0.0, 1.0) | None = None
    flops: _number(0.0, 1e22) | None = None
    checkpoint_step: Annotated[int, Field(strict=True, ge=0, le=2**53)] | None = None
    checkpoint_at: _number(0.0, 1e11) | None = None
    rank: Annotated[int, Field(strict=True, ge=0, le=1_000_000)] | None = None
    node: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    step_time_s: _number(1e-6, 86_400.0) | None = None
    event: Literal["progress", "checkpoint", "resume", "preempted", "finished"] = "progress"

    def data(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class NodeAction(_Strict):
    reason: Annotated[str, Field(max_length=500)] = ""


class Drain(_Strict):
    """`POST /v1/drain`: the longest notice a running job gets (default: its tier's)."""

    grace_s: Annotated[float, Field(ge=0, le=1e7, allow_inf_nan=False)] | None = None
