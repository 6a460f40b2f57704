"""The snapshot the dashboard copies from a real engine, as the control loop holds it."""

from __future__ import annotations

import time
from types import SimpleNamespace

from gpu_arbiter.control.live import LiveScheduler
from gpu_arbiter.domain import Cluster, JobSpec, Node, Rack, Team, Tier
from gpu_arbiter.economy import Budgets, ChargeModel, Ledger
from gpu_arbiter.web import snapshot
from gpu_arbiter.web.reasons import reasons


def loop_over(nodes: int, jobs: list[JobSpec], racks: int = 1) -> SimpleNamespace:
    """What `snapshot.copy` reads of a ControlLoop, around a real engine."""
    cluster = Cluster.build(
        "t",
        [Node(f"n{i}", "H100", 8, f"r{i % racks}") for i in range(nodes)],
        [Rack(f"r{r}", power_cap_w=1e6) for r in range(racks)],
    )
    teams = {"a": Team("a", 1.0, {"H100": 8}), "b": Team("b", 1.0, {})}
    sched = LiveScheduler(cluster, teams.values())
    for spec in jobs:
        sched.submit(spec, 0.0)
    sched.cycle(1.0)
    return SimpleNamespace(
        sched=sched,
        nodes={"n1": {"state": "cordoned", "reason": "swap"}},
        live={},
        segs={},
        teams=teams,
        budgets=Budgets(Ledger(), {}),
        burn={},
        charges=ChargeModel(),
    )


def spec(id: str, team: str, tier: int, gpus: int) -> JobSpec:
    return JobSpec(id=id, team=team, tier=Tier(tier), gpus=gpus, duration_s=1e6)


def test_snapshot_has_the_engines_free_gpus_holdings_and_queue():
    loop = loop_over(2, [spec("j1", "a", 1, 8), spec("j2", "b", 3, 4), spec("j3", "b", 3, 8)])
    loop.sched.node_down("n1", 1.0)  # j2 ran there and is queued again
    snap = snapshot.take(loop, 2.0)
    nodes = {n.name: n for n in snap.nodes}
    assert nodes["n1"].state == "cordoned" and nodes["n1"].reason == "swap"
    assert nodes["n0"].free_mask == 0
    assert [(h.job_id, h.tier, h.borrowed) for h in snap.holdings["n0"]] == [("j1", 1, False)]
    assert sorted(j.id for j in snap.pending) == ["j2", "j3"]
    assert {r.code for r in reasons(snap).values()} == {"capacity"}
    team_a = next(t for t in snap.teams if t.name == "a")
    assert team_a.used == {"H100": 8} and team_a.remaining is None


def test_copying_a_ten_thousand_gpu_engine_costs_the_loop_milliseconds():
    jobs = [spec(f"j{i}", "b", 3, (1, 2, 4, 8)[i % 4]) for i in range(2000)]
    loop = loop_over(1280, jobs, racks=40)
    t0 = time.perf_counter()
    copied = snapshot.copy(loop, 2.0)
    assert time.perf_counter() - t0 < 0.1
    snap = snapshot.build(copied)
    assert sum(n.gpus for n in snap.nodes) == 10_240
    assert len(snap.pending) + len(loop.sched.running) == 2000


def test_a_tier1_job_beyond_its_teams_quota_and_what_is_left_of_the_pool_says_quota():
    # Team a's guarantee is 8 GPUs of 24, so the pool is 16; a's tier-1 job holds 12 of it.
    loop = loop_over(3, [spec("j1", "a", 1, 20), spec("j2", "b", 1, 8)])
    snap = snapshot.take(loop, 2.0)
    assert [j.id for j in snap.pending] == ["j2"]
    assert reasons(snap)["j2"].code == "quota"  # 8 more do not fit in the 4 left


def test_a_teams_use_counts_a_fractional_job_at_its_share():
    quarter = JobSpec(id="q", team="a", tier=Tier(2), gpus=1, duration_s=1e6, gpu_milli=250)
    loop = loop_over(1, [spec("j1", "a", 2, 4), quarter])
    team_a = next(t for t in snapshot.take(loop, 2.0).teams if t.name == "a")
    assert team_a.used == {"H100": 4.25}
