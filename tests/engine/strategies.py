"""Hypothesis strategies: small random clusters and finite workloads that can always finish.

Every generated job can run on an empty cluster within the power caps: its smallest size fits
the racks of its first accepted GPU type (each rack's cap powers at least one full node at high
power), its tensor-parallel size fits that type's NVLink domain, and its rack cap is honoured.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from gpu_arbiter.domain import GPU_CATALOG, MILLI, Cluster, JobSpec, Node, Rack, Team, Tier
from gpu_arbiter.domain.team import default_teams

TYPES = ("H100", "A100")


@dataclass(frozen=True)
class Shape:
    """What a workload generator needs to know about a cluster."""

    cluster: Cluster
    domain: dict[str, int]  # NVLink domain of every node of the type
    rack_usable: dict[str, list[int]]  # per type: GPUs each rack can power at high profile


@st.composite
def clusters(draw: st.DrawFn) -> Shape:
    n_types = draw(st.integers(1, 2))
    types = TYPES[:n_types]
    n_racks = draw(st.integers(max(1, n_types), 4))
    rack_types = [types[i % n_types] for i in range(n_racks)]
    gpn = [draw(st.sampled_from([2, 4, 8])) for _ in range(n_racks)]
    domain: dict[str, int] = {}
    for t in types:
        smallest = min(g for g, rt in zip(gpn, rack_types, strict=True) if rt == t)
        domain[t] = draw(st.sampled_from(sorted({smallest, max(1, smallest // 2)})))
    racks, nodes = [], []
    usable: dict[str, list[int]] = {t: [] for t in types}
    for r in range(n_racks):
        t, g = rack_types[r], gpn[r]
        count = draw(st.integers(1, 6))
        powered = draw(st.integers(1, count))  # full nodes the cap can power at high profile
        idle = 1000.0 * count
        cap = idle + powered * g * GPU_CATALOG[t].power_w
        racks.append(Rack(name=f"r{r}", pod=f"p{r // 2}", power_cap_w=cap))
        nodes += [Node(f"r{r}-n{k}", t, g, f"r{r}", nvlink_domain=domain[t]) for k in range(count)]
        usable[t].append(powered * g)
    cluster = Cluster.build("prop", nodes, racks)
    return Shape(cluster, domain, usable)


@st.composite
def team_sets(draw: st.DrawFn, shape: Shape) -> list[Team]:
    n = draw(st.integers(1, 3))
    weights = {f"t{i}": float(draw(st.integers(1, 3))) for i in range(n)}
    share = draw(st.sampled_from([0.5, 0.8, 1.0]))
    return default_teams(shape.cluster.gpus_by_type(), weights, share)


@st.composite
def job_specs(draw: st.DrawFn, shape: Shape, teams: list[Team], i: int) -> JobSpec:
    types = list(shape.domain)
    t = draw(st.sampled_from(types))
    tp = draw(st.sampled_from([x for x in (1, 2, 4, 8) if x <= shape.domain[t]]))
    max_racks = draw(st.none() | st.integers(1, 3))
    racks = sorted(shape.rack_usable[t], reverse=True)
    feasible = sum(racks[:max_racks] if max_racks else racks) // tp
    lo = draw(st.integers(1, max(1, min(feasible, 8)))) * tp
    gpus, hi = lo, lo
    if draw(st.booleans()):
        gpus = draw(st.integers(lo // tp, max(lo // tp, feasible))) * tp
        hi = draw(st.integers(gpus // tp, max(gpus // tp, feasible))) * tp
    accepted: dict[str, float] = {}
    others = [x for x in types if x != t]
    if draw(st.booleans()):
        accepted[t] = GPU_CATALOG[t].speed
        if others and draw(st.booleans()):
            accepted[others[0]] = GPU_CATALOG[others[0]].speed
    elif others and shape.domain[others[0]] < tp:
        accepted[t] = GPU_CATALOG[t].speed
    if not accepted and others:
        # Accepting any type: the smallest size must fit the other type too.
        o_racks = sorted(shape.rack_usable[others[0]], reverse=True)
        o_feasible = sum(o_racks[:max_racks] if max_racks else o_racks)
        if lo > o_feasible:
            accepted[t] = GPU_CATALOG[t].speed
    # One GPU, not elastic: a fractional share of one (S11) half of the time.
    milli = MILLI
    if lo == gpus == hi == 1 and draw(st.booleans()):
        milli = draw(st.sampled_from([250, 500, 700]))
    duration = float(draw(st.integers(10, 5000)))
    walltime = draw(st.none() | st.floats(0.5, 3.0).map(lambda f: round(duration * f, 1)))
    return JobSpec(
        id=f"j{i:02d}",
        team=draw(st.sampled_from([team.name for team in teams])),
        tier=Tier(draw(st.integers(1, 3))),
        gpus=gpus,
        duration_s=duration,
        submit_s=float(draw(st.integers(0, 3000))),
        gpu_types=accepted,
        walltime_s=walltime,
        min_gpus=lo if lo != gpus else None,
        max_gpus=hi if hi != gpus else None,
        max_racks=max_racks,
        tp_size=tp,
        checkpoint_interval_s=draw(st.none() | st.sampled_from([60.0, 300.0, 1200.0])),
        power_profile=draw(st.sampled_from(["normal", "high"])),
        gpu_milli=milli,
    )


@st.composite
def scenarios(draw: st.DrawFn, max_jobs: int = 12) -> tuple[Shape, list[Team], list[JobSpec]]:
    shape = draw(clusters())
    teams = draw(team_sets(shape))
    n = draw(st.integers(1, max_jobs))
    jobs = [draw(job_specs(shape, teams, i)) for i in range(n)]
    return shape, teams, jobs
