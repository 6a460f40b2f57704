"""Synthetic snapshots, and engines as the control loop holds them, too large to write by
hand (shared with `bench/dashboard_bench.py`)."""

from __future__ import annotations

from types import SimpleNamespace

from gpu_arbiter.domain import Cluster, JobSpec, Node, Rack, Team, Tier
from gpu_arbiter.economy import Budgets, ChargeModel, Ledger
from gpu_arbiter.engine import Scheduler
from gpu_arbiter.web.snapshot import Holding, NodeState, Snapshot


def big_cluster(racks: int = 40, nodes_per_rack: int = 32, gpus: int = 8) -> Snapshot:
    """10,240 GPUs, a quarter of them free and a few nodes failed."""
    nodes, holdings = [], {}
    for r in range(racks):
        for i in range(nodes_per_rack):
            name = f"r{r:02d}n{i:02d}"
            state = "down" if (r * nodes_per_rack + i) % 97 == 0 else "up"
            busy = (r + i) % 4
            free = (1 << gpus) - 1 if not busy and state == "up" else 0
            nodes.append(NodeState(name, f"rack{r:02d}", "H100", gpus, gpus, state, "", free))
            if busy and state == "up":
                tier = 1 + (r + i) % 3
                holdings[name] = (
                    Holding(f"j{r}-{i}", "t", tier, busy == 3, False, tuple(range(gpus))),
                )
    return Snapshot(now=0.0, nodes=tuple(nodes), holdings=holdings)


def loop_over(nodes: int, jobs: list[JobSpec], racks: int = 1) -> SimpleNamespace:
    """What `snapshot.copy` reads of a ControlLoop (its `state` and `accounts`), around a real
    engine."""
    cluster = Cluster.build(
        "t",
        [Node(f"n{i}", "H100", 8, f"r{i % racks}") for i in range(nodes)],
        [Rack(f"r{r}", power_cap_w=1e6) for r in range(racks)],
    )
    teams = {"a": Team("a", 1.0, {"H100": 8}), "b": Team("b", 1.0, {})}
    sched = Scheduler(cluster, teams.values())
    for spec in jobs:
        sched.submit(spec, 0.0)
    sched.cycle(1.0)
    state = SimpleNamespace(
        sched=sched, nodes={"n1": {"state": "cordoned", "reason": "swap"}}, live={}, teams=teams
    )
    accounts = SimpleNamespace(
        segs={}, budgets=Budgets(Ledger(), {}), burn={}, charges=ChargeModel()
    )
    return SimpleNamespace(state=state, accounts=accounts)


def spec(id: str, team: str, tier: int, gpus: int) -> JobSpec:
    return JobSpec(id=id, team=team, tier=Tier(tier), gpus=gpus, duration_s=1e6)


def ten_thousand_gpu_loop() -> SimpleNamespace:
    """1,280 8-GPU nodes in 40 racks and 2,000 tier-3 jobs of 1 to 8 GPUs."""
    jobs = [spec(f"j{i}", "b", 3, (1, 2, 4, 8)[i % 4]) for i in range(2000)]
    return loop_over(1280, jobs, racks=40)
