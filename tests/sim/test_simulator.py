"""The simulator: deterministic, event-driven, and its KPIs exact on scenarios small enough to
work out by hand."""

import gc

import pytest

from gpu_arbiter.domain import Team
from gpu_arbiter.domain.presets import small
from gpu_arbiter.engine import EngineConfig
from gpu_arbiter.metrics import Segment, timeline
from gpu_arbiter.sim import SimConfig, Simulator, simulate
from gpu_arbiter.traces.synthetic import synthetic_teams, synthetic_workload
from tests.conftest import job
from tests.engine.helpers import cluster

QUIET = SimConfig(economy=None, reliability=None)  # the engine alone: no billing, no faults


def one_node():
    return cluster({"name": "r0", "nodes": 1})


@pytest.mark.parametrize("policy", ["arbiter", "tiresias"])
def test_the_same_seed_gives_the_same_kpis(policy):
    c = small()
    runs = [
        simulate(c, synthetic_teams(c), policy, synthetic_workload(60, 7, c)).kpis for _ in range(2)
    ]
    for kpis in runs:
        kpis.pop("sim_wall_s")
    assert runs[0] == runs[1]


def test_cycles_follow_events_not_simulated_seconds():
    specs = [
        job(f"j{i}", gpus=1 + i % 8, duration=1e6 * (1 + i), submit_s=i * 5e5) for i in range(10)
    ]
    sim = Simulator(small(), [], "arbiter", specs, QUIET)
    kpis = sim.run().kpis
    assert kpis["completed"] == 10
    assert kpis["makespan_s"] > 1e7
    assert sim.cycles <= 2 * 2 * len(specs)  # one arrival and one finish each


def test_two_jobs_on_one_node_have_the_hand_computed_kpis():
    specs = [job("a", gpus=8, duration=100.0), job("b", gpus=4, duration=50.0, submit_s=10.0)]
    result = simulate(one_node(), [], "arbiter", specs, QUIET)
    by_id = {r.id: r for r in result.records}
    assert (by_id["a"].jct_s, by_id["a"].queue_delay_s) == (100.0, 0.0)
    assert (by_id["b"].jct_s, by_id["b"].queue_delay_s) == (140.0, 90.0)
    kpis = result.kpis
    assert kpis["makespan_s"] == 150.0
    assert kpis["avg_jct_s"] == 120.0
    assert kpis["utilization"] == pytest.approx((8 * 100 + 4 * 50) / (8 * 150))
    assert kpis["goodput"] == pytest.approx(kpis["utilization"])
    assert kpis["p50_queue_delay_s_by_tier"]["3"] == 45.0


def test_a_preempted_tier3_job_loses_the_work_since_its_checkpoint_and_finishes_later():
    specs = [
        job("x", team="b", gpus=8, duration=1000.0, checkpoint_interval_s=300.0),
        job("core", tier=1, gpus=8, duration=100.0, submit_s=400.0),
    ]
    result = simulate(one_node(), [], "arbiter", specs, QUIET)
    by_id = {r.id: r for r in result.records}
    # x ran 0-400 and kept 300 s; core ran 400-500; x restarts at 500, restores for 60 s and
    # does the remaining 700 s: done at 1260.
    assert by_id["core"].jct_s == 100.0
    assert by_id["x"].finished_at == 1260.0
    assert by_id["x"].lost_gpu_s == pytest.approx(8 * 100.0)
    assert result.kpis["tier1_preempted"] == 0


def test_a_tier3_job_with_an_hour_unsaved_saves_for_a_tier1_job_and_loses_nothing():
    """x has no periodic checkpoints; at 3600 s a stop would throw away 8 GPU-hours, over the
    1 h cap (`EngineConfig.tier1_stop_max_unsaved_s`). It saves in the minute that takes:
    core waits 60 s and runs 3660-3760; x restores for 60 s from 3760 and does its last
    6340 s of work, done at 10,160 s."""
    specs = [
        job("x", team="b", gpus=8, duration=10_000.0),
        job("core", tier=1, gpus=8, duration=100.0, submit_s=3600.0),
    ]
    result = simulate(one_node(), [], "arbiter", specs, QUIET)
    by_id = {r.id: r for r in result.records}
    assert by_id["core"].queue_delay_s == 60.0
    assert by_id["x"].lost_gpu_s == 0.0
    assert by_id["x"].finished_at == pytest.approx(10_160.0)
    assert result.kpis["tier1_preempted"] == 0


def test_a_victim_stopped_at_once_restarts_on_another_free_type_without_waiting_for_an_event():
    """core (tier 1, H100s only) stops x at once at 400 s. The A100s are free, so x restarts
    there in a cycle right after, not when core ends at 10,400 s (the next event): it restores
    for 60 s and runs its 1000 s of work at half speed."""
    c = cluster(
        {"name": "fast", "nodes": 1, "gpu_type": "H100"},
        {"name": "slow", "nodes": 1, "gpu_type": "A100"},
    )
    speeds = {"H100": 1.0, "A100": 0.5}
    specs = [
        job("x", team="b", gpus=8, duration=1000.0, walltime_s=1000.0, gpu_types=speeds),
        job("core", tier=1, gpus=8, duration=10_000.0, submit_s=400.0, gpu_types={"H100": 1.0}),
    ]
    by_id = {r.id: r for r in simulate(c, [], "arbiter", specs, QUIET).records}
    assert (by_id["x"].preemptions, by_id["x"].gpu_type) == (1, "A100")
    assert by_id["x"].finished_at == pytest.approx(400.0 + 60.0 + 2000.0)
    assert by_id["core"].queue_delay_s == 0.0


def test_a_tier1_request_admitted_at_tier2_is_not_counted_as_a_tier1_preemption():
    """Found by the property suite: the KPI counted the tier asked for, so preempting a job
    whose tier-1 request was too large for its quota and the pool read as an S1 breach."""
    teams = [Team("a", quota={"H100": 4}), Team("b", quota={"H100": 4})]
    specs = [
        job("too-big", team="a", tier=1, gpus=8, duration=1000.0),
        job("core", team="a", tier=1, gpus=2, duration=10.0, submit_s=10.0),
    ]
    sim = Simulator(one_node(), teams, "arbiter", specs, QUIET)
    kpis = sim.run().kpis
    assert sim.sched.jobs["too-big"].tier == 2
    assert sim.sched.jobs["too-big"].preemptions == 1
    assert kpis["tier1_preempted"] == 0


# Jobs that save and stop soon after their notice (the default, as the SDK does) and jobs
# that run on until their grace ends (`notice_stop_s` = the grace).
SAVES_SOON = QUIET
RUNS_TO_THE_END = SimConfig(
    economy=None, reliability=None, engine=EngineConfig(notice_stop_s=QUIET.engine.tier2_grace_s)
)


@pytest.mark.parametrize(
    ("config", "left_s"), [(SAVES_SOON, 30.0), (RUNS_TO_THE_END, 30.0), (RUNS_TO_THE_END, 100.0)]
)
def test_a_tier2_victim_that_finishes_before_it_would_stop_completes_instead(config, left_s):
    """x gets a stop notice with `left_s` of work left, less than it would run on for: it
    completes then (no work lost, not counted unfinished) and the tier-1 job starts on its GPUs
    then."""
    specs = [
        job("x", team="b", tier=2, gpus=8, duration=1000.0),
        job("core", tier=1, gpus=8, duration=100.0, submit_s=1000.0 - left_s),
    ]
    sim = Simulator(one_node(), [], "arbiter", specs, config)
    result = sim.run()
    by_id = {r.id: r for r in result.records}
    assert by_id["x"].finished_at == 1000.0
    assert by_id["x"].lost_gpu_s == 0.0
    assert by_id["core"].queue_delay_s == left_s
    assert result.kpis["completed"] == 2
    assert not sim.sched.pending_stops


@pytest.mark.parametrize("config", [SAVES_SOON, RUNS_TO_THE_END])
def test_a_tier2_victim_with_more_work_stops_when_it_has_saved_or_its_grace_ends(config):
    """The preemptor waits as long as the victim runs on after its notice: until it has saved
    (`notice_stop_s`, 60 s by default) or, for a job that runs until it is killed, the grace."""
    grace = config.engine.tier2_grace_s
    specs = [
        job("x", team="b", tier=2, gpus=8, duration=grace * 3),
        job("core", tier=1, gpus=8, duration=100.0, submit_s=10.0),
    ]
    result = simulate(one_node(), [], "arbiter", specs, config)
    by_id = {r.id: r for r in result.records}
    assert by_id["core"].queue_delay_s == min(grace, config.engine.notice_stop_s)
    assert by_id["x"].lost_gpu_s == 0.0  # the checkpoint it was asked for kept it all
    assert by_id["x"].finished_at > grace * 3 + 100.0


def test_the_timeline_bins_held_and_useful_gpu_time_by_overlap():
    segments = [
        Segment(0.0, 50.0, 2, 50.0),  # 2 GPUs, half of their time kept
        Segment(25.0, 100.0, 4, 300.0),  # 4 GPUs, all kept
        Segment(60.0, 60.0, 8, 0.0),  # empty: ignored
    ]
    tl = timeline(segments, total_gpus=8, start_s=0.0, end_s=100.0, bins=4)
    assert tl["t"] == [0.0, 25.0, 50.0, 75.0]
    assert tl["utilization"] == pytest.approx([0.25, 0.75, 0.5, 0.5])
    assert tl["goodput"] == pytest.approx([0.125, 0.625, 0.5, 0.5])


def test_the_timeline_of_many_segments_matches_their_one_by_one_sum():
    """Segments are binned a block at a time: blocks add up to the sum over single segments."""
    segments = [Segment(float(i), i + 7.5, 1 + i % 3, 0.5 * (1 + i % 3) * 7.5) for i in range(9000)]
    tl = timeline(segments, total_gpus=100, start_s=0.0, end_s=9010.0, bins=10)
    for b, util in enumerate(tl["utilization"]):
        lo, hi = 901.0 * b, 901.0 * (b + 1)
        held = sum(s.gpus * max(0.0, min(hi, s.end) - max(lo, s.start)) for s in segments)
        assert util == pytest.approx(held / (901.0 * 100))
        assert tl["goodput"][b] == pytest.approx(util / 2)


def test_a_run_makes_no_full_garbage_collection_and_restores_the_thresholds():
    """A run's live objects (jobs, segments, ledger entries) are not walked by full
    collections; young ones go on, and the collector is left as the run found it."""
    before = gc.get_threshold()
    generations = []

    def note(phase, info):
        if phase == "start":
            generations.append(info["generation"])

    c = small()
    sim = Simulator(c, synthetic_teams(c), "arbiter", synthetic_workload(200, 3, c))
    # Leave the test session's objects out (a full collection waits until the objects that
    # survived into the oldest generation since the last one are a quarter of those there),
    # and collect often: without the pause, the run makes full collections.
    gc.freeze()
    gc.collect()
    gc.set_threshold(50, 1, 1)
    gc.callbacks.append(note)
    try:
        sim.run()
        assert gc.get_threshold() == (50, 1, 1)
    finally:
        gc.callbacks.remove(note)
        gc.set_threshold(*before)
        gc.unfreeze()
    assert 0 in generations and 2 not in generations
