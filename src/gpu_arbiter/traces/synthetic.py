"""A seeded synthetic workload shaped like published GPU-cluster traces.

Shapes follow what Philly, Helios and Alibaba PAI report: most jobs use one GPU, a few use many;
run times are heavy-tailed (log-normal, median about an hour); arrivals are Poisson at a rate
that keeps the cluster at the requested offered load. Run times are reference seconds (speed
1.0), so the capacity that load is a share of is speed-weighted: an A100 at 0.87 serves 0.87 of
a reference GPU-second per second. Teams, tiers, GPU-type constraints, elastic ranges,
checkpointing, tensor parallelism, rack caps and power profiles are drawn so every engine step
is exercised. The same (n, seed, cluster) always gives the same jobs.

Optional shares turn some jobs into inference services with a latency SLO (S9), fractional-GPU
jobs (S11) or jobs that develop an F5 pathology. They draw from a second generator, so with all
shares 0 (the default) the workload is exactly what it was without them.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from gpu_arbiter.domain import (
    PATHOLOGIES,
    Cluster,
    InvalidInput,
    JobKind,
    JobSpec,
    Team,
    Tier,
    default_teams,
)

TEAM_WEIGHTS = {
    "llm-core": 3.0,
    "search": 2.0,
    "ads": 2.0,
    "vision": 1.0,
    "speech": 1.0,
    "research": 1.0,
}
SIZES = np.array([1, 2, 4, 8, 16, 32, 64, 128])
SIZE_P = np.array([0.50, 0.08, 0.12, 0.17, 0.06, 0.04, 0.02, 0.01])
TIER_P = np.array([0.15, 0.35, 0.50])
SLICES = np.array([142, 250, 500])  # MIG-style 1/7, quarter and half GPUs, in milli-GPUs
INFERENCE_SLO_MS = 50.0  # SPEC S9's example P99


def synthetic_teams(cluster: Cluster, guaranteed_share: float = 0.8) -> list[Team]:
    return default_teams(cluster.gpus_by_type(), TEAM_WEIGHTS, guaranteed_share)


def serving_capacity(cluster: Cluster) -> float:
    """Reference GPU-seconds of work the cluster serves per second: each type's GPUs times its
    catalog speed."""
    return sum(n * cluster.gpu_types[t].speed for t, n in cluster.gpus_by_type().items())


def synthetic_workload(
    n: int,
    seed: int,
    cluster: Cluster,
    load: float = 0.9,
    inference_share: float = 0.0,
    fractional_share: float = 0.0,
    pathology_share: float = 0.0,
) -> list[JobSpec]:
    """`n` jobs in submission order, offering `load` × the cluster's `serving_capacity`; about the
    given shares of them are inference services, fractional one-GPU jobs and jobs with a
    pathology (see the module docstring)."""
    for name, share in (
        ("inference_share", inference_share),
        ("fractional_share", fractional_share),
        ("pathology_share", pathology_share),
    ):
        if not 0 <= share <= 1:
            raise InvalidInput(f"synthetic workload: {name} must be in [0, 1], got {share}")
    if n <= 0:
        raise InvalidInput(f"synthetic workload: the number of jobs must be > 0, got {n}")
    if not 0 < load <= 10:
        raise InvalidInput(f"synthetic workload: load must be in (0, 10], got {load}")
    rng = np.random.default_rng(seed)
    by_type = cluster.gpus_by_type()
    types = sorted(by_type, key=lambda t: -cluster.gpu_types[t].speed)
    biggest = max(cluster.max_gang(t) for t in types)
    sizes_ok = SIZES <= max(1, biggest // 4)
    p = SIZE_P * sizes_ok
    p = p / p.sum()
    teams = list(TEAM_WEIGHTS)
    team_p = np.array(list(TEAM_WEIGHTS.values()))
    team_p = team_p / team_p.sum()

    gpus = rng.choice(SIZES, size=n, p=p)
    tiers = rng.choice([1, 2, 3], size=n, p=TIER_P)
    # Larger and core jobs run longer; clip to [2 min, 7 days].
    median = 3600.0 * (1 + np.log2(gpus) / 3) * np.where(tiers == 1, 2.0, 1.0)
    durations = np.clip(rng.lognormal(np.log(median), 1.3), 120.0, 7 * 86400.0)
    offered = float(np.mean(gpus * durations))
    rate = load * serving_capacity(cluster) / offered  # arrivals per second
    submits = np.cumsum(rng.exponential(1.0 / rate, size=n))
    submits -= submits[0]
    over = rng.uniform(1.2, 3.0, size=n)
    u = rng.random((n, 8))
    team_idx = rng.choice(len(teams), size=n, p=team_p)
    rack_gpus = max(sum(nd.gpus for nd in cluster.nodes if nd.rack == r) for r in cluster.racks)
    specs = []
    for i in range(n):
        g = int(gpus[i])
        tier = int(tiers[i])
        dur = float(round(durations[i]))
        walltime = math.ceil(dur * over[i] / 900.0) * 900.0
        accepted: dict[str, float] = {}
        if len(types) > 1 and u[i, 0] < 0.5:
            # Pinned to one or two types, with a job-specific speed around the catalog figure.
            k = 1 if u[i, 1] < 0.6 else 2
            start = 0 if u[i, 2] < 0.7 else int(u[i, 2] * len(types)) % len(types)
            for t in (types + types)[start : start + k]:
                # A Python float: a numpy scalar here made all of the job's arithmetic slow.
                speed = round(cluster.gpu_types[t].speed * (0.9 + 0.2 * u[i, 3]), 3)
                accepted[t] = float(speed)
        elastic = g >= 4 and tier > 1 and u[i, 4] < 0.15
        min_g = max(1, g // 2) if elastic else None
        max_g = min(g * 2, max(g, biggest // 4)) if elastic else None
        tp = 8 if g >= 16 and u[i, 5] < 0.3 else 1
        if tp > 1 and elastic:
            tp = 1
        ckpt = None if u[i, 6] < 0.2 else (600.0 if u[i, 6] < 0.3 else 1800.0)
        max_racks = None
        if g > rack_gpus // 2 and u[i, 7] < 0.5:
            max_racks = math.ceil(g / rack_gpus) + 1
        long_big = g > 128 and walltime > 86400
        specs.append(
            JobSpec(
                id=f"job-{i:06d}",
                team=teams[team_idx[i]],
                tier=Tier(tier),
                gpus=g,
                duration_s=dur,
                submit_s=float(round(submits[i], 3)),
                gpu_types=accepted,
                walltime_s=walltime,
                min_gpus=min_g,
                max_gpus=max_g,
                max_racks=max_racks,
                tp_size=tp,
                checkpoint_interval_s=ckpt,
                power_profile="high" if g >= 8 and u[i, 3] > 0.8 else "normal",
                justification="roadmap model" if long_big and u[i, 5] < 0.8 else None,
            )
        )
    if inference_share or fractional_share or pathology_share:
        specs = _variants(specs, seed, inference_share, fractional_share, pathology_share)
    return specs


def _variants(
    specs: list[JobSpec], seed: int, inference: float, fractional: float, pathology: float
) -> list[JobSpec]:
    """Turn drawn shares of the jobs into services, fractional jobs or sick jobs."""
    rng = np.random.default_rng([seed, 1])
    u = rng.random((len(specs), 5))
    out = []
    for i, spec in enumerate(specs):
        if u[i, 0] < inference:
            spec = replace(
                spec,
                kind=JobKind.INFERENCE,
                latency_slo_ms=INFERENCE_SLO_MS,
                tier=Tier.BUSINESS,
                gpus=min(spec.gpus, 8),
                min_gpus=None,
                max_gpus=None,
                tp_size=1,
                max_racks=None,
                checkpoint_interval_s=None,
                justification=None,
            )
        elif spec.gpus == 1 and not spec.is_elastic and u[i, 1] < fractional:
            spec = replace(spec, gpu_milli=int(SLICES[int(u[i, 2] * len(SLICES))]))
        elif spec.tier != Tier.CORE and u[i, 3] < pathology:
            kind = PATHOLOGIES[int(u[i, 4] * len(PATHOLOGIES))]
            onset = round(spec.duration_s * (0.1 + 0.5 * u[i, 2]))
            spec = replace(spec, pathology=kind, pathology_onset_s=float(onset))
        out.append(spec)
    return out
