"""Turning command-line choices into a cluster, teams and jobs (shared by simulate and bench)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpu_arbiter.domain import Cluster, InvalidInput, JobSpec, Team, default_teams
from gpu_arbiter.domain.presets import PRESETS, resolve_cluster
from gpu_arbiter.traces.alibaba import alibaba_cluster
from gpu_arbiter.traces.base import ReadStats, TraceOptions
from gpu_arbiter.traces.gavel import gavel_cluster
from gpu_arbiter.traces.registry import read_trace
from gpu_arbiter.traces.synthetic import synthetic_teams, synthetic_workload
from gpu_arbiter.traces.tiresias import tiresias_cluster

CLUSTER_HELP = (
    "Preset (" + ", ".join(PRESETS) + "), a YAML file, alibaba-v2023 (the trace's real node "
    "list), gavel:V100:P100:K80 counts, or tiresias:SPEC.csv."
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
    if name == "alibaba-v2023":
        if trace is None:
            raise InvalidInput(
                "--cluster alibaba-v2023 needs --trace (its node list lies beside it)"
            )
        node_list = trace.parent / "openb_node_list_gpu_node.csv"
        if not node_list.is_file():
            raise InvalidInput(f"--cluster alibaba-v2023: no node list at {node_list}")
        return alibaba_cluster(node_list)
    if name.startswith("gavel:"):
        return gavel_cluster(name.removeprefix("gavel:"))
    if name.startswith("tiresias:"):
        return tiresias_cluster(name.removeprefix("tiresias:"))
    return resolve_cluster(name)


def load_inputs(
    cluster: str,
    workload: str = "synthetic:1000",
    seed: int = 0,
    load: float = 0.9,
    trace: Path | None = None,
    fmt: str | None = None,
    strict: bool = False,
    limit: int | None = None,
) -> Inputs:
    if trace is None:
        topo = cluster_for(cluster)
        jobs = synthetic_workload(parse_synthetic(workload), seed, topo, load=load)
        return Inputs(topo, synthetic_teams(topo), jobs, None)
    if fmt is None:
        raise InvalidInput(
            "--trace needs --format (alibaba-v2023, tiresias, gavel, philly, helios, pai2020)"
        )
    options = TraceOptions(seed=seed, strict=strict, limit=limit)
    specs, stats = read_trace(trace, fmt, options)
    topo = cluster_for(cluster, trace)
    jobs = list(specs)
    if not jobs:
        raise InvalidInput(f"trace {trace}: no usable jobs ({stats.summary()})")
    names = sorted({j.team for j in jobs})
    return Inputs(topo, default_teams(topo.gpus_by_type(), names), jobs, stats)
