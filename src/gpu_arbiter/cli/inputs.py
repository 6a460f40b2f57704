"""Turning command-line choices into a cluster, teams and jobs (shared by simulate and bench)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpu_arbiter.domain import MILLI, Cluster, InvalidInput, JobSpec, Team, default_teams
from gpu_arbiter.domain.config_files import first_error, read_yaml_mapping
from gpu_arbiter.domain.presets import PRESETS, resolve_cluster
from gpu_arbiter.engine import EngineConfig
from gpu_arbiter.traces.alibaba import alibaba_cluster
from gpu_arbiter.traces.arbiter_history import history_cluster, history_teams
from gpu_arbiter.traces.base import AUTO, DEFAULT_TIER_MIX, ReadStats, TraceOptions
from gpu_arbiter.traces.gavel import gavel_cluster
from gpu_arbiter.traces.registry import read_trace
from gpu_arbiter.traces.synthetic import synthetic_teams, synthetic_workload
from gpu_arbiter.traces.tiresias import tiresias_cluster

CLUSTER_HELP = (
    "Preset (" + ", ".join(PRESETS) + "), a YAML file, alibaba-v2023 (the trace's real node "
    "list; alibaba-v2023@F keeps a share F of each GPU model's nodes), gavel:V100:P100:K80 "
    "counts, tiresias:SPEC.csv, or history (the cluster of an arbiter history --trace)."
)


@dataclass(slots=True)
class Inputs:
    cluster: Cluster
    teams: list[Team]
    jobs: list[JobSpec]
    stats: ReadStats | None  # set when the jobs came from a trace


def parse_synthetic(spec: str) -> int:
    """`synthetic:N` → N."""
    kind, _, count = spec.partition(":")
    if kind != "synthetic" or not count:
        raise InvalidInput(f"--workload {spec!r}: expected synthetic:N (or use --trace FILE)")
    try:
        n = int(count)
    except ValueError:
        raise InvalidInput(f"--workload {spec!r}: N must be an integer") from None
    if n <= 0:
        raise InvalidInput(f"--workload {spec!r}: N must be > 0")
    return n


def cluster_for(name: str, trace: Path | None = None) -> Cluster:
    if name == "alibaba-v2023" or name.startswith("alibaba-v2023@"):
        fraction = 1.0
        if "@" in name:
            try:
                fraction = float(name.partition("@")[2])
            except ValueError:
                raise InvalidInput(
                    f"--cluster {name!r}: expected alibaba-v2023@F with F a fraction in (0, 1]"
                ) from None
        if trace is None:
            raise InvalidInput(
                "--cluster alibaba-v2023 needs --trace (its node list lies beside it)"
            )
        node_list = trace.parent / "openb_node_list_gpu_node.csv"
        if not node_list.is_file():
            raise InvalidInput(f"--cluster alibaba-v2023: no node list at {node_list}")
        return alibaba_cluster(node_list, fraction=fraction)
    if name == "history":
        if trace is None:
            raise InvalidInput("--cluster history needs --trace (an arbiter history file)")
        return history_cluster(trace)
    if name.startswith("gavel:"):
        return gavel_cluster(name.removeprefix("gavel:"))
    if name.startswith("tiresias:"):
        return tiresias_cluster(name.removeprefix("tiresias:"))
    return resolve_cluster(name)


NOTICE_STOP_S = EngineConfig().notice_stop_s
NOTICE_STOP_HELP = (
    "Seconds a job given a stop notice takes to save its checkpoint and stop; a tier-2 job's "
    "grace (2 h) is its deadline, a tier-3 job (stopped for tier 2 or 3) gets just this long. "
    "Default: as long as a restart's restore. 7200: jobs ignore the notice and run until they "
    "are killed; 0: jobs cannot save on notice."
)


def engine_config(notice_stop_s: float) -> EngineConfig:
    """The engine's defaults with the `--notice-stop` the options ask for."""
    if not 0 <= notice_stop_s < math.inf:
        raise InvalidInput(f"--notice-stop must be a number of seconds >= 0, got {notice_stop_s}")
    return EngineConfig(notice_stop_s=notice_stop_s)


ARRIVAL_SCALE_HELP = (
    "Multiply trace submit times (inter-arrival gaps) by this factor; durations and walltimes "
    "are unchanged, so 0.01 offers 100x the load. 1 replays the trace's own arrivals."
)


def check_arrival_scale(factor: float) -> None:
    """Refuse an `--arrival-scale` that is not a finite number above 0."""
    if not (factor > 0 and math.isfinite(factor)):
        raise InvalidInput(f"--arrival-scale must be > 0, got {factor}")


def scale_arrivals(jobs: list[JobSpec], factor: float) -> list[JobSpec]:
    """Compress (factor < 1) or stretch the gaps between arrivals, keeping every job's work
    and walltime: the way to replay a lightly loaded trace at a realistic load. Unlike
    `TraceOptions.time_scale`, which scales durations too and so leaves the load unchanged."""
    check_arrival_scale(factor)
    if factor == 1.0:
        return jobs
    return [dataclasses.replace(j, submit_s=j.submit_s * factor) for j in jobs]


# How a trace's jobs get tiers, teams and estimates (`TraceOptions`), shared by the commands
# that read traces.
TIER_FIELD_HELP = (
    "Trace field whose value picks a job's tier: auto (the format's own: Alibaba qos, Gavel "
    "priority_class; the other formats draw every tier from --tier-mix), mix (draw every "
    "tier), or a field of the format, with --tier-map."
)
TIER_MAP_HELP = (
    "VALUE=TIER pairs for --tier-field, comma separated (e.g. LS=1,Burstable=2,BE=3); a value "
    "not listed draws its tier from --tier-mix. Default: the format's own map."
)
TIER_MIX = ",".join(f"{share:g}" for share in DEFAULT_TIER_MIX)
TIER_MIX_HELP = (
    "Shares of tiers 1, 2 and 3 among the jobs whose tier the trace does not give, drawn by a "
    "seeded hash of the job id (0,0,1: every such job at tier 3)."
)
StrictOption = Annotated[bool, typer.Option(help="Fail on the first bad trace row.")]
LimitOption = Annotated[int | None, typer.Option(help="Read at most this many trace jobs.")]
TierFieldOption = Annotated[str, typer.Option(help=TIER_FIELD_HELP)]
TierMapOption = Annotated[str | None, typer.Option(help=TIER_MAP_HELP)]
TierMixOption = Annotated[str, typer.Option(help=TIER_MIX_HELP)]
TeamFieldOption = Annotated[
    str,
    typer.Option(
        help="Trace field whose value is a job's team: auto (Philly and Helios vc; the other "
        "formats hash), hash (teams team-a .. team-f by a seeded hash of the user, else of "
        "the job id), or a field of the format."
    ),
]
WalltimeOption = Annotated[
    str,
    typer.Option(
        help="Walltime estimate the schedulers get: round-hour (the run time rounded up to "
        "whole hours, as users ask), exact, or none."
    ),
]


def parse_tier_map(text: str) -> dict[str, int]:
    """`LS=1,BE=3` → {"LS": 1, "BE": 3}."""
    mapping: dict[str, int] = {}
    for pair in text.split(","):
        value, sep, tier = (part.strip() for part in pair.partition("="))
        if not sep or not value or tier not in ("1", "2", "3"):
            raise InvalidInput(
                f"--tier-map {text!r}: expected VALUE=TIER pairs with TIER 1, 2 or 3, "
                f"got {pair.strip()!r}"
            )
        if value in mapping:
            raise InvalidInput(f"--tier-map {text!r}: {value!r} is given twice")
        mapping[value] = int(tier)
    return mapping


def parse_tier_mix(text: str) -> tuple[float, float, float]:
    """`0.15,0.35,0.5` → (0.15, 0.35, 0.5); `TraceOptions` checks that they add up to 1."""
    try:
        core, business, exploratory = (float(part) for part in text.split(","))
    except ValueError:
        raise InvalidInput(
            f"--tier-mix {text!r}: expected three numbers, the shares of tiers 1, 2 and 3"
        ) from None
    return core, business, exploratory


def trace_options(
    strict: bool = False,
    limit: int | None = None,
    tier_field: str = AUTO,
    tier_map: str | None = None,
    tier_mix: str = TIER_MIX,
    team_field: str = AUTO,
    walltime: str = "round-hour",
) -> TraceOptions:
    """The `TraceOptions` the command-line options ask for, checked; `load_inputs` sets the
    seed of each replay. Whether the fields exist is checked when the trace is opened."""
    return TraceOptions(
        team_field=team_field,
        tier_field=tier_field,
        tier_map=None if tier_map is None else parse_tier_map(tier_map),
        tier_mix=parse_tier_mix(tier_mix),
        walltime=walltime,  # TraceOptions refuses any but its three
        limit=limit,
        strict=strict,
    )


def demand_weights(jobs: Iterable[JobSpec]) -> dict[str, float]:
    """Each team's share of the trace's GPU demand (GPU-seconds of work, reference seconds
    times GPUs), as business weights. The default for trace replays: a cluster sizes each
    team's guarantee by what the team runs, and a trace is the only record of that. A floor
    of 1 % of the mean keeps a team with little demand from a zero weight."""
    demand: dict[str, float] = {}
    for j in jobs:
        demand[j.team] = demand.get(j.team, 0.0) + j.duration_s * j.gpus * j.gpu_milli / MILLI
    mean = sum(demand.values()) / len(demand)
    floor = max(0.01 * mean, 1e-9)
    return {team: max(d, floor) / mean for team, d in sorted(demand.items())}


def load_inputs(
    cluster: str,
    workload: str = "synthetic:1000",
    seed: int = 0,
    load: float = 0.9,
    trace: Path | None = None,
    fmt: str | None = None,
    reading: TraceOptions | None = None,
    arrival_scale: float = 1.0,
) -> Inputs:
    """The cluster, teams and jobs to simulate. A trace is read with `reading` (defaults:
    `TraceOptions`) under `seed`. Trace teams get quotas and fair-share weights in proportion
    to their GPU demand in the trace (`demand_weights`); `arrival_scale` compresses or
    stretches a trace's arrivals (`scale_arrivals`)."""
    if trace is None:
        topo = cluster_for(cluster)
        jobs = synthetic_workload(parse_synthetic(workload), seed, topo, load=load)
        return Inputs(topo, synthetic_teams(topo), jobs, None)
    if fmt is None:
        raise InvalidInput(
            "--trace needs --format (alibaba-v2023, tiresias, gavel, philly, helios, pai2020, "
            "arbiter)"
        )
    options = dataclasses.replace(reading or TraceOptions(), seed=seed)
    specs, stats = read_trace(trace, fmt, options)
    topo = cluster_for(cluster, trace)
    jobs = scale_arrivals(list(specs), arrival_scale)
    if not jobs:
        raise InvalidInput(f"trace {trace}: no usable jobs ({stats.summary()})")
    if fmt == "arbiter":  # the cluster's own history carries the teams that were in force
        return Inputs(topo, history_teams(trace, topo), jobs, stats)
    return Inputs(topo, default_teams(topo.gpus_by_type(), demand_weights(jobs)), jobs, stats)


_Weight = Annotated[float, Field(gt=0, allow_inf_nan=False)]
_Credits = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _TeamModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    weight: _Weight = 1.0
    quota: dict[str, Annotated[int, Field(ge=0)]] | None = None
    budget: _Credits | None = None  # credits per budget period (E1); absent: not metered


class _TeamsFile(BaseModel):
    """The `--teams FILE` YAML::

    guaranteed_share: 0.8        # split by weight among teams that give no quota
    teams:
      search: {weight: 2, budget: 5000}
      vision: {weight: 1, quota: {H100: 16}}
    """

    model_config = ConfigDict(extra="forbid")

    guaranteed_share: Annotated[float, Field(ge=0, le=1)] = 0.8
    teams: Annotated[dict[str, _TeamModel], Field(min_length=1)]


def load_teams(path: Path, cluster: Cluster, jobs: Iterable[JobSpec]) -> list[Team]:
    """Teams (weights, quotas, budgets) from a YAML file, checked against the cluster's GPU
    types and against the teams the workload's jobs name, so a typo fails here, not as a team
    that silently has no quota."""
    source = f"teams file {path}"
    try:
        model = _TeamsFile.model_validate(read_yaml_mapping(path, "teams file"))
    except ValidationError as e:
        raise first_error(source, e) from None
    capacity = cluster.gpus_by_type()
    weights = {name: t.weight for name, t in model.teams.items()}
    split = {t.name: t.quota for t in default_teams(capacity, weights, model.guaranteed_share)}
    teams = []
    for name, t in model.teams.items():
        for gpu_type in t.quota or {}:
            if gpu_type not in capacity:
                have = ", ".join(sorted(capacity))
                raise InvalidInput(
                    f"{source}: teams.{name}.quota: unknown GPU type {gpu_type} "
                    f"(the cluster has {have})"
                )
        quota = split[name] if t.quota is None else t.quota
        teams.append(Team(name, t.weight, quota, t.budget))
    missing = sorted({j.team for j in jobs} - set(model.teams))
    if missing:
        raise InvalidInput(f"{source}: no entry for team(s) {', '.join(missing)} of the workload")
    return teams


def with_budget(teams: Iterable[Team], credits: float) -> list[Team]:
    """Give every team that has no budget `credits` per period (`--budget`)."""
    if not (credits >= 0 and math.isfinite(credits)):
        raise InvalidInput(f"--budget must be >= 0 credits, got {credits}")
    return [
        t if t.budget_per_period is not None else dataclasses.replace(t, budget_per_period=credits)
        for t in teams
    ]
