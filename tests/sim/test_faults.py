"""F1-F5 in the simulator and the engine: failed nodes, exact lost work, hot spares, MTTR,
circuit breakers and goodput."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_arbiter.domain import Cluster, InvalidInput, JobState, Node, Rack, Start, Tier
from gpu_arbiter.domain.presets import small
from gpu_arbiter.domain.team import default_teams
from gpu_arbiter.engine import Scheduler
from gpu_arbiter.reliability import (
    DEGRADED_KINDS,
    Action,
    BreakerPolicy,
    FailureModel,
    FaultKind,
    NodeFault,
)
from gpu_arbiter.sim import SimConfig, simulate
from gpu_arbiter.sim.faults import ReliabilityConfig
from gpu_arbiter.traces.synthetic import synthetic_teams, synthetic_workload
from tests.conftest import job


def three_nodes() -> Cluster:
    """n0 and n1 of 8 GPUs; s0, a 4-GPU node meant as the hot spare."""
    nodes = [Node("n0", "H100", 8, "r0"), Node("n1", "H100", 8, "r0"), Node("s0", "H100", 4, "r0")]
    return Cluster.build("three", nodes, [Rack("r0")])


def scheduler(spares: tuple[str, ...] = ("s0",)) -> Scheduler:
    c = three_nodes()
    sched = Scheduler(c, default_teams(c.gpus_by_type(), {"a": 1.0}))
    sched.reserve_spares(spares)
    return sched


def fill_and_fail(sched: Scheduler) -> list[str]:
    """An uncheckpointed tier-2 job and a checkpointed tier-1 job share n0, a tier-2 job fills
    n1; n0 fails 1000 s in."""
    sched.submit(job("plain", tier=2, gpus=4, duration=10_000), 0.0)
    sched.submit(job("ckpt", tier=1, gpus=4, duration=10_000, checkpoint_interval_s=600), 0.0)
    sched.submit(job("other", tier=2, gpus=8, duration=50_000), 0.0)
    starts = [d for d in sched.cycle(0.0).decisions if isinstance(d, Start)]
    nodes = {d.job_id: d.allocation.nodes for d in starts}
    assert (nodes["plain"], nodes["ckpt"], nodes["other"]) == ((0,), (0,), (1,))
    return sched.node_down("n0", 1000.0)


def test_a_failed_node_loses_exactly_the_work_since_each_jobs_last_checkpoint():
    sched = scheduler()
    assert fill_and_fail(sched) == ["plain", "ckpt"]
    plain, ckpt = sched.jobs["plain"], sched.jobs["ckpt"]
    assert ckpt.progress_s == 600.0 and ckpt.lost_gpu_s == 400.0 * 4
    assert ckpt.useful_gpu_s == 600.0 * 4
    assert plain.progress_s == 0.0 and plain.lost_gpu_s == 1000.0 * 4
    assert plain.useful_gpu_s == 0.0


def test_an_uncheckpointed_job_is_demoted_after_a_failure():
    sched = scheduler()
    fill_and_fail(sched)
    assert sched.jobs["plain"].tier == Tier.EXPLORATORY and sched.jobs["plain"].failure_demoted
    assert sched.jobs["ckpt"].tier == Tier.CORE


def test_tier_1_restarts_first_and_on_the_hot_spare():
    sched = scheduler()
    fill_and_fail(sched)  # the spare fits only one of the two displaced 4-GPU jobs
    spare = sched.cluster.node("s0").index
    ckpt = sched.jobs["ckpt"]
    assert ckpt.state == JobState.RUNNING and ckpt.allocation.nodes == (spare,)
    assert ckpt.stalled_until == 1000.0 + sched.cfg.restart_overhead_s
    assert sched.jobs["plain"].state == JobState.PENDING
    starts = [d.job_id for d in sched.cycle(1000.0).decisions if isinstance(d, Start)]
    assert starts == ["ckpt"]
    assert not sched.spares.free


def test_spares_are_kept_out_of_normal_placement():
    sched = scheduler()
    sched.submit(job("big", gpus=8), 0.0)
    sched.submit(job("big2", gpus=8), 0.0)
    sched.submit(job("small", gpus=4), 0.0)
    started = {d.job_id for d in sched.cycle(0.0).decisions if isinstance(d, Start)}
    assert started == {"big", "big2"}  # s0 is free, but it is a spare
    assert sched.index.type_free["H100"] == 0


def test_a_repaired_node_refills_the_spare_pool():
    sched = scheduler()
    fill_and_fail(sched)
    sched.node_up("n0", 5000.0)
    assert sched.spares.free == {sched.cluster.node("n0").index: None}
    sched.cycle(5000.0)  # the spare stays held: the pending job cannot use it
    assert sched.jobs["plain"].state == JobState.PENDING


def test_without_a_spare_the_displaced_jobs_queue():
    sched = scheduler(spares=())
    sched.submit(job("filler", tier=1, gpus=4, duration=50_000), 0.0)  # best fit: s0
    fill_and_fail(sched)
    assert sched.jobs["ckpt"].state == sched.jobs["plain"].state == JobState.PENDING
    assert not [d for d in sched.cycle(1000.0).decisions if isinstance(d, Start)]


def test_only_a_free_healthy_node_can_be_a_spare():
    sched = scheduler(spares=())
    sched.submit(job("x", gpus=4), 0.0)
    sched.cycle(0.0)
    with pytest.raises(InvalidInput, match="down or busy"):
        sched.reserve_spares(["s0"])  # x went there: the best fit


def scripted(*faults: NodeFault, spares: int = 0, **kw) -> SimConfig:
    return SimConfig(reliability=ReliabilityConfig(script=faults, spares_per_type=spares, **kw))


def test_the_simulator_restarts_failed_jobs_and_measures_mttr_and_lost_work():
    c = small()
    teams = default_teams(c.gpus_by_type(), {"a": 1.0})
    specs = [
        job("ckpt", tier=1, gpus=8, duration=7200, checkpoint_interval_s=600),
        job("plain", tier=1, gpus=8, duration=7200),
    ]
    fault = NodeFault("r0000-n00", 1000.0, FaultKind.GPU_FATAL, 3600.0, True)
    res = simulate(c, teams, "arbiter", specs, scripted(fault))
    k = res.kpis
    assert k["completed"] == 2 and k["failures"] == 1 and k["tier1_preempted"] == 0
    assert k["mttr_s"] == 3600.0
    assert k["failure_lost_gpu_hours"] == pytest.approx(400 * 8 / 3600)
    assert k["job_recovery_s"] == c_overhead()
    ckpt = next(r for r in res.records if r.id == "ckpt")
    assert ckpt.restarts == 1 and ckpt.finished_at == pytest.approx(7200 + 400 + c_overhead())
    assert any(e["kind"] == "failure" and e["jobs"] == ["ckpt"] for e in res.events)


def c_overhead() -> float:
    return SimConfig().engine.restart_overhead_s


def test_a_non_fatal_fault_is_counted_and_stops_nothing():
    c = small()
    teams = default_teams(c.gpus_by_type(), {"a": 1.0})
    fault = NodeFault("r0000-n00", 100.0, FaultKind.THERMAL_THROTTLE, 600.0, False)
    k = simulate(c, teams, "arbiter", [job("j", gpus=8, duration=1000)], scripted(fault)).kpis
    assert (k["faults"], k["failures"], k["lost_gpu_hours"]) == (1, 0, 0.0)


def breaker_run(action: Action, pathology: str = "nan_loss", walltime: float | None = 36_000):
    c = small()
    teams = default_teams(c.gpus_by_type(), {"a": 1.0})
    sick = job(
        "sick",
        gpus=4,
        duration=36_000,
        pathology=pathology,
        pathology_onset_s=1800,
        walltime_s=walltime,
    )
    specs = [sick, job("well", gpus=4, duration=36_000)]
    cfg = SimConfig(reliability=ReliabilityConfig(failures=False, breakers=BreakerPolicy(action)))
    return simulate(c, teams, "arbiter", specs, cfg)


@pytest.mark.parametrize("pathology", ["nan_loss", "grad_explosion", "divergence", "io_stall"])
def test_a_stop_breaker_releases_a_sick_job_and_counts_the_gpu_hours_saved(pathology):
    res = breaker_run(Action.STOP, pathology)
    k = res.kpis
    sick = next(r for r in res.records if r.id == "sick")
    assert k["breaker_trips"] == k["breaker_stops"] == 1
    assert not sick.completed and sick.finished_at >= 1800
    # The GPU time it would still have held up to its walltime estimate (what the service counts).
    assert k["gpu_hours_saved_by_breakers"] == pytest.approx((36_000 - sick.finished_at) * 4 / 3600)
    assert k["completed"] == 1


def test_a_stop_breaker_counts_a_job_without_walltime_as_running_as_long_again():
    res = breaker_run(Action.STOP, walltime=None)
    sick = next(r for r in res.records if r.id == "sick")
    assert sick.first_start == 0.0 and sick.restarts == sick.preemptions == 0
    held = (sick.finished_at - sick.first_start) * 4 / 3600
    assert res.kpis["gpu_hours_saved_by_breakers"] == pytest.approx(held)


def test_a_flag_breaker_lets_the_job_run_on():
    k = breaker_run(Action.FLAG).kpis
    assert k["breaker_trips"] == 1 and k["breaker_stops"] == 0
    assert k["completed"] == 2 and k["gpu_hours_saved_by_breakers"] == 0.0


def test_failures_repeat_for_a_seed_and_differ_across_seeds():
    c = small()
    teams = synthetic_teams(c)
    specs = synthetic_workload(150, 3, c)

    def run(seed: int) -> dict:
        rel = ReliabilityConfig(seed=seed, gpu_afr=5.0, node_afr=5.0, spares_per_type=1)
        k = simulate(c, teams, "arbiter", specs, SimConfig(reliability=rel)).kpis
        return {key: v for key, v in k.items() if not key.startswith(("sim_wall", "inference_r"))}

    a, b = run(1), run(1)
    assert a == b and a["failures"] > 0
    assert run(2) != a


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 1000), afr=st.floats(0.5, 20.0), spares=st.integers(0, 1))
def test_goodput_never_exceeds_utilisation_under_failures(seed, afr, spares):
    c = small()
    specs = synthetic_workload(60, seed, c)
    rel = ReliabilityConfig(seed=seed, gpu_afr=afr, node_afr=afr, spares_per_type=spares)
    k = simulate(c, synthetic_teams(c), "arbiter", specs, SimConfig(reliability=rel)).kpis
    assert k["goodput"] <= k["utilization"] + 1e-9
    assert k["completed"] == 60 and k["tier1_preempted"] == 0
    assert k["failure_lost_gpu_hours"] <= k["lost_gpu_hours"] + 1e-9


def test_synthetic_variants_leave_the_default_workload_untouched():
    c = small()
    plain = synthetic_workload(300, 5, c)
    assert plain == synthetic_workload(300, 5, c, 0.9, 0.0, 0.0, 0.0)
    mixed = synthetic_workload(
        300, 5, c, inference_share=0.1, fractional_share=0.5, pathology_share=0.2
    )
    assert [s.id for s in mixed] == [s.id for s in plain]
    assert any(s.kind == "inference" and s.latency_slo_ms == 50.0 for s in mixed)
    assert any(s.gpu_milli < 1000 for s in mixed)
    sick = [s for s in mixed if s.pathology]
    assert sick and all(s.tier != Tier.CORE and s.pathology_onset_s < s.duration_s for s in sick)
    with pytest.raises(InvalidInput, match="pathology_share"):
        synthetic_workload(10, 0, c, pathology_share=1.5)


def test_simulate_json_reports_failures_mttr_and_breakers():
    from typer.testing import CliRunner

    from gpu_arbiter.cli.main import app

    args = ["simulate", "--workload", "synthetic:80", "--afr", "30", "--spares", "1", "--json"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    kpis = json.loads(out.stdout)
    for field in (
        "goodput",
        "lost_gpu_hours",
        "failures",
        "mttr_s",
        "breaker_trips",
        "gpu_hours_saved_by_breakers",
        "inference_release_p99_ms",
    ):
        assert field in kpis
    assert kpis["failures"] > 0 and kpis["mttr_s"] > 0
    assert kpis["goodput"] <= kpis["utilization"]
    off = CliRunner().invoke(app, [*args, "--no-failures"])
    assert json.loads(off.stdout)["failures"] == 0


def gang_on_a_degraded_node(**kw) -> dict:
    """A checkpointed 16-GPU job on n0 and n1 of three 8-GPU nodes; n1's NIC goes slow at
    1000 s for 20000 s, making the job run at half speed while it stays there."""
    c = Cluster.build("three", [Node(f"n{i}", "H100", 8, "r0") for i in range(3)], [Rack("r0")])
    teams = default_teams(c.gpus_by_type(), {"a": 1.0})
    fault = NodeFault("n1", 1000.0, FaultKind.NIC_DEGRADED, 20_000.0, False)
    rel = ReliabilityConfig(script=(fault,), failures=False, degraded_slowdown=2.0, **kw)
    specs = [job("g", gpus=16, duration=10_000, checkpoint_interval_s=600)]
    res = simulate(c, teams, "arbiter", specs, SimConfig(reliability=rel))
    return {"kpis": res.kpis, "events": res.events}


def test_a_gang_on_a_degraded_node_runs_at_its_slowest_ranks_pace():
    run = gang_on_a_degraded_node(stragglers=None)  # nobody watches step times
    k = run["kpis"]
    # 1000 s at full speed, then the 9000 s left take twice as long.
    assert k["avg_jct_s"] == pytest.approx(1000 + 2 * 9000)
    assert k["straggler_slow_gpu_hours"] == pytest.approx(9000 * 16 / 3600)
    assert (k["degraded_nodes"], k["stragglers_caught"], k["straggler_restarts"]) == (1, 0, 0)


def test_the_straggler_watch_catches_the_node_and_the_gang_restarts_without_it():
    run = gang_on_a_degraded_node()  # the default watch: 1.5x for 300 s
    k = run["kpis"]
    assert (k["stragglers_caught"], k["straggler_restarts"]) == (1, 1)
    caught = [e for e in run["events"] if e["kind"] == "straggler"]
    assert caught == [{"t": 1300.0, "kind": "straggler", "node": "n1", "jobs": ["g"]}]
    assert k["straggler_slow_gpu_hours"] == pytest.approx(300 / 2 * 16 / 3600)
    assert k["avg_jct_s"] < 1000 + 2 * 9000 - 7000  # it moved to n0 and n2 at 1300 s


def test_degraded_nodes_are_off_by_default_and_leave_the_failures_as_they_were():
    c = small()
    on = FailureModel(3, kinds=DEGRADED_KINDS, gpu_afr=0.0, node_afr=5.0, stream=1)
    slow = on.schedule(c, 90 * 86_400.0)
    assert slow and {f.kind for f in slow} == {FaultKind.NIC_DEGRADED}
    assert not any(f.fatal for f in slow)
    base = FailureModel(3).schedule(c, 365 * 86_400.0)
    assert FailureModel(3, stream=0).schedule(c, 365 * 86_400.0) == base
    assert ReliabilityConfig().degraded_afr == 0
    specs = [job("j", gpus=8, duration=1000)]
    k = simulate(c, default_teams(c.gpus_by_type(), {"a": 1.0}), "arbiter", specs).kpis
    assert "degraded_nodes" not in k
