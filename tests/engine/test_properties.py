"""Properties of every cycle over random small clusters and finite workloads, driven through
the real simulator: no GPU is ever double-booked, the capacity index never drifts, gangs are
all-or-nothing, rack power caps hold, and every job finishes. Under the Arbiter policy also:
tier-1 jobs are never preempted and a team's guaranteed usage never exceeds its quota."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_arbiter.domain import Team, Tier
from gpu_arbiter.engine import Scheduler
from gpu_arbiter.engine.policies import POLICIES
from gpu_arbiter.sim import SimConfig, Simulator
from tests.conftest import job
from tests.engine.invariants import check_all
from tests.engine.strategies import scenarios

# The `cluster` fixture is an immutable preset, so sharing it across examples is safe.
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
QUIET = SimConfig(economy=None, reliability=None, max_time_s=1e6)  # the engine alone


def checked(sim: Simulator) -> Simulator:
    """Run the invariants after every cycle the simulator runs."""
    sched = sim.sched
    cycle = sched.cycle

    def cycle_and_check(now: float):
        result = cycle(now)
        check_all(sched, result.decisions)
        return result

    sched.cycle = cycle_and_check
    return sim


@pytest.mark.parametrize("policy", sorted(POLICIES))
@SETTINGS
@given(scenario=scenarios())
def test_every_cycle_keeps_the_invariants_and_every_job_completes(policy, scenario):
    shape, teams, specs = scenario
    sim = checked(Simulator(shape.cluster, teams, policy, specs, QUIET))
    kpis = sim.run().kpis
    unfinished = [
        (j.id, j.state.value, j.gpus_held) for j in sim.sched.jobs.values() if j.finished_at is None
    ]
    assert kpis["completed"] == len(specs), unfinished
    assert kpis["goodput"] <= kpis["utilization"] + 1e-9
    assert kpis["tier1_preempted"] == 0 or policy != "arbiter"


@SETTINGS
@given(
    borrowers=st.lists(
        st.tuples(st.integers(1, 8), st.sampled_from([Tier.BUSINESS, Tier.EXPLORATORY])),
        min_size=1,
        max_size=12,
    ),
    size=st.integers(1, 8),
    tier=st.sampled_from([Tier.BUSINESS, Tier.EXPLORATORY]),
)
def test_a_team_within_its_quota_gets_its_guarantee_back_from_borrowers(
    cluster, borrowers, size, tier
):
    """Team b fills the cluster far beyond its quota; team a then asks for no more than its
    own guarantee and starts at once, or once its victims stopped within their notice (the
    tier-2 grace; for tier 3, the minute a job takes to save)."""
    teams = [Team("a", quota={"H100": 24}), Team("b", quota={"H100": 24})]
    sched = Scheduler(cluster, teams)
    for i, (gpus, t) in enumerate(borrowers):
        sched.submit(job(f"b{i}", team="b", tier=t, gpus=gpus, duration=1e6), 0.0)
    fill = [job(f"f{i}", team="b", gpus=1, duration=1e6) for i in range(64)]
    for spec in fill:
        sched.submit(spec, 0.0)
    check_all(sched, sched.cycle(0.0).decisions)
    # A few GPUs may stay free: a blocked large borrower's EASY reservation holds back fill jobs
    # that have no walltime. Team a's guarantee must come back either way.
    sched.submit(job("mine", team="a", tier=tier, gpus=size, duration=10.0), 1.0)
    result = sched.cycle(1.0)
    check_all(sched, result.decisions)
    mine = sched.jobs["mine"]
    if mine.id in sched.holds:
        notice = {Tier.BUSINESS: 7200.0, Tier.EXPLORATORY: sched.cfg.notice_stop_s}
        for victim in list(sched.holds[mine.id].waiting):
            assert sched.pending_stops[victim].grace_s == notice[sched.jobs[victim].tier]
            sched.stopped(victim, 7201.0)
    assert mine.allocation is not None and mine.allocation.gpus == size
    assert not mine.borrowed


ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["submit", "finish", "stop", "down", "up", "cancel"]), st.integers(0, 99)
    ),
    max_size=40,
)


@pytest.mark.parametrize("policy", ["arbiter", "tiresias"])
@SETTINGS
@given(scenario=scenarios(), actions=ACTIONS)
def test_driver_reports_in_any_order_keep_the_invariants(policy, scenario, actions):
    """Finishes, stops after grace, node failures and repairs and cancels, in any order, keep
    the index exact; once every node is back and jobs keep finishing, every job ends."""
    shape, teams, specs = scenario
    sched = Scheduler(shape.cluster, teams, policy)
    nodes = [n.name for n in shape.cluster.nodes]
    todo = sorted(specs, key=lambda s: s.submit_s)
    now = 0.0

    def pick(items, k):
        items = sorted(items)
        return items[k % len(items)] if items else None

    for kind, k in actions + [("submit", 0)] * len(todo):
        now += 10.0
        if kind == "submit" and todo:
            sched.submit(todo.pop(0), now)
        elif kind == "finish" and (j := pick(sched.running, k)):
            sched.finished(j, now)
        elif kind == "stop" and (j := pick(sched.pending_stops, k)):
            sched.stopped(j, now)
        elif kind == "down":
            sched.node_down(nodes[k % len(nodes)], now)
        elif kind == "up":
            sched.node_up(nodes[k % len(nodes)], now)
        elif kind == "cancel" and (
            j := pick((i for i, x in sched.jobs.items() if x.state in ("pending", "running")), k)
        ):
            sched.cancel(j, now)
        check_all(sched, sched.cycle(now).decisions)
    for name in nodes:
        sched.node_up(name, now)
    for _ in range(4 * len(specs) + 4):
        now += 10.0
        for j in sorted(sched.pending_stops):
            sched.stopped(j, now)
        for j in sorted(sched.running):
            sched.finished(j, now)
        check_all(sched, sched.cycle(now).decisions)
    left = [j.id for j in sched.jobs.values() if j.state in ("pending", "running")]
    assert not left
