"""Arbiter weighs the work a preemption throws away against the preemptor's expected wait.

A tier-3 victim of a tier-2 or tier-3 job is asked to save first (it stops within
`EngineConfig.notice_stop_s` and loses nothing). A tier-1 preemptor (S1) stops tier-3 jobs at
once while they lose little (`EngineConfig.tier1_stop_max_unsaved_s`) and otherwise gives them
the minute a save takes. Only where jobs cannot save on notice (`notice_stop_s` = 0), and for
the tier-1 job's cheap victims, is unsaved work lost and weighed."""

from gpu_arbiter.domain import Team
from gpu_arbiter.engine import EngineConfig, Scheduler
from tests.conftest import job
from tests.engine.helpers import cluster, cycle, preempts, starts

TEAMS = [Team("a", quota={"H100": 8}), Team("b", quota={"H100": 0})]


def one_node():
    return cluster({"name": "r0", "nodes": 1, "power_cap_kw": 40.0})


CANNOT_SAVE = EngineConfig(notice_stop_s=0.0)


def borrowed_tier3(
    walltime: float | None, checkpoint: float | None = None, config: EngineConfig = CANNOT_SAVE
) -> Scheduler:
    sched = Scheduler(one_node(), TEAMS, config=config)
    spec = job("x", team="b", tier=3, gpus=8, duration=1e5, walltime_s=walltime)
    if checkpoint is not None:
        spec = job(
            "x",
            team="b",
            tier=3,
            gpus=8,
            duration=1e5,
            walltime_s=walltime,
            checkpoint_interval_s=checkpoint,
        )
    sched.submit(spec, 0.0)
    cycle(sched, 0.0)
    return sched


def test_a_tier2_job_waits_when_the_victim_would_lose_more_gpu_time_than_it_waits():
    sched = borrowed_tier3(walltime=3600.0)  # 3000 s x 8 GPUs lost vs 600 s x 8 waited
    sched.submit(job("biz", team="a", tier=2, gpus=8), 3000.0)
    decisions = cycle(sched, 3000.0)
    assert not preempts(decisions) and "biz" not in starts(decisions)


def test_a_tier2_job_reclaims_when_the_borrower_has_no_end_in_sight():
    sched = borrowed_tier3(walltime=None)
    sched.submit(job("biz", team="a", tier=2, gpus=8), 1000.0)
    decisions = cycle(sched, 1000.0)
    assert set(preempts(decisions)) == {"x"} and "biz" in starts(decisions)


def test_a_victim_that_just_checkpointed_loses_nothing_and_is_stopped():
    sched = borrowed_tier3(walltime=3600.0, checkpoint=500.0)
    sched.submit(job("biz", team="a", tier=2, gpus=8), 1000.0)
    decisions = cycle(sched, 1000.0)
    assert set(preempts(decisions)) == {"x"}


def test_tier1_waits_only_within_its_five_minute_target():
    soon = borrowed_tier3(walltime=1100.0)
    soon.submit(job("core", team="a", tier=1, gpus=8), 1000.0)
    assert not preempts(cycle(soon, 1000.0))
    later = borrowed_tier3(walltime=3600.0)
    later.submit(job("core", team="a", tier=1, gpus=8), 1000.0)
    decisions = cycle(later, 1000.0)
    assert set(preempts(decisions)) == {"x"} and "core" in starts(decisions)


def test_the_victim_that_loses_least_work_goes_before_a_borrowed_one():
    """Two tier-3 jobs without checkpoints: one borrowed (team c owns nothing) running for 10 h,
    one owned (team b's quota) that started a minute ago; a tier-1 job of team a, within its
    quota, may take either and takes the one that loses a minute."""
    teams = [Team("a", quota={"H100": 8}), Team("b", quota={"H100": 8}), Team("c")]
    sched = Scheduler(cluster({"name": "r0", "nodes": 3, "power_cap_kw": 120.0}), teams)
    sched.submit(job("old", team="c", tier=3, gpus=8, duration=1e6), 0.0)
    sched.submit(job("other", team="c", tier=3, gpus=8, duration=1e6), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("new", team="b", tier=3, gpus=8, duration=1e6), 36000.0)
    cycle(sched, 36000.0)
    assert sched.jobs["old"].borrowed and not sched.jobs["new"].borrowed
    sched.submit(job("core", team="a", tier=1, gpus=8), 36060.0)
    decisions = cycle(sched, 36060.0)
    assert set(preempts(decisions)) == {"new"} and "core" in starts(decisions)


def test_lost_work_counts_double_against_the_wait():
    """At 1500 s the borrower has 1500 s x 8 GPUs unsaved and 2100 s to go by its estimate: a
    wait of 2100 s is shorter than twice the loss, so the tier-2 job waits; weighing the loss
    once, it would preempt."""
    sched = borrowed_tier3(walltime=3600.0)
    sched.submit(job("biz", team="a", tier=2, gpus=8), 1500.0)
    assert not preempts(cycle(sched, 1500.0))
    once = borrowed_tier3(
        walltime=3600.0, config=EngineConfig(notice_stop_s=0.0, lost_work_weight=1.0)
    )
    once.submit(job("biz", team="a", tier=2, gpus=8), 1500.0)
    assert set(preempts(cycle(once, 1500.0))) == {"x"}


def test_a_tier3_victim_of_a_tier2_job_saves_first_and_loses_nothing():
    """Jobs that save on notice (the default): where x would lose 3000 s x 8 GPUs, biz gives it
    a minute to save instead, starts once it has stopped, and x keeps all its work."""
    sched = borrowed_tier3(walltime=3600.0, config=EngineConfig())
    sched.submit(job("biz", team="a", tier=2, gpus=8), 3000.0)
    order = preempts(cycle(sched, 3000.0))["x"]
    assert order.grace_s == 60.0 and order.checkpoint
    sched.stopped("x", 3060.0)
    assert "biz" in starts(cycle(sched, 3060.0))
    assert sched.jobs["x"].progress_s == 3060.0


def test_a_tier1_job_stops_tier3_at_once_while_it_loses_little():
    """x has run 400 s on 8 GPUs: 3,200 GPU-seconds unsaved, within the 1 h cap."""
    sched = borrowed_tier3(walltime=None, config=EngineConfig())
    sched.submit(job("core", team="a", tier=1, gpus=8), 400.0)
    decisions = cycle(sched, 400.0)
    assert preempts(decisions)["x"].grace_s == 0.0 and "core" in starts(decisions)


def test_a_tier1_job_lets_a_tier3_victim_with_hours_unsaved_save_first():
    """x has run 1000 s on 8 GPUs: 8,000 GPU-seconds would be thrown away, more than the cap.
    It gets the minute a save takes (S1: suspended, not killed), core starts once it stopped,
    and x keeps all its work."""
    sched = borrowed_tier3(walltime=None, config=EngineConfig())
    sched.submit(job("core", team="a", tier=1, gpus=8), 1000.0)
    decisions = cycle(sched, 1000.0)
    order = preempts(decisions)["x"]
    assert order.grace_s == 60.0 and order.checkpoint and "core" not in starts(decisions)
    sched.stopped("x", 1060.0)
    assert "core" in starts(cycle(sched, 1060.0))
    assert sched.jobs["x"].progress_s == 1060.0


def test_a_tier1_job_takes_the_victim_that_stops_at_once_first():
    """Two tier-3 victims: old has hours unsaved (it would save for a minute), fresh started
    a minute ago (it stops at once and loses 480 GPU-seconds). The tier-1 job starts at once
    on fresh's node; a cap of 0 gives both a save, and the one expected to run longest goes."""
    teams = [Team("a", quota={"H100": 8}), Team("b")]

    def two_victims(config: EngineConfig) -> Scheduler:
        sched = Scheduler(
            cluster({"name": "r0", "nodes": 2, "power_cap_kw": 80.0}), teams, config=config
        )
        sched.submit(job("old", team="b", tier=3, gpus=8, duration=1e6, walltime_s=2e6), 0.0)
        cycle(sched, 0.0)
        sched.submit(job("fresh", team="b", tier=3, gpus=8, duration=1e6, walltime_s=1e6), 7200.0)
        cycle(sched, 7200.0)
        sched.submit(job("core", team="a", tier=1, gpus=8), 7260.0)
        return sched

    sched = two_victims(EngineConfig())
    decisions = cycle(sched, 7260.0)
    assert set(preempts(decisions)) == {"fresh"} and "core" in starts(decisions)
    saves = two_victims(EngineConfig(tier1_stop_max_unsaved_s=0.0))
    assert preempts(cycle(saves, 7260.0))["old"].grace_s == 60.0


def test_a_tier1_job_stops_tier3_at_once_where_jobs_cannot_save():
    sched = borrowed_tier3(walltime=None)  # notice_stop_s = 0
    sched.submit(job("core", team="a", tier=1, gpus=8), 1000.0)
    decisions = cycle(sched, 1000.0)
    assert preempts(decisions)["x"].grace_s == 0.0 and "core" in starts(decisions)


def fast_taken_slow_free(walltime: float | None) -> Scheduler:
    """x (tier 3, team b, no checkpoints) fills the one H100 node from 0 s; the A100 node, where
    a tier-1 job would run at half speed, is free."""
    c = cluster(
        {"name": "fast", "nodes": 1, "gpu_type": "H100"},
        {"name": "slow", "nodes": 1, "gpu_type": "A100"},
    )
    sched = Scheduler(c, [Team("a", quota={"H100": 8, "A100": 8}), Team("b")])
    x = job(
        "x", team="b", tier=3, gpus=8, duration=1e5, walltime_s=walltime, gpu_types={"H100": 1.0}
    )
    sched.submit(x, 0.0)
    cycle(sched, 0.0)
    return sched


def core_at(sched: Scheduler, now: float, a100_speed: float = 0.5) -> list:
    speeds = {"H100": 1.0, "A100": a100_speed}
    sched.submit(job("core", team="a", tier=1, gpus=8, walltime_s=36_000.0, gpu_types=speeds), now)
    return cycle(sched, now)


def test_a_tier1_job_that_could_start_on_free_gpus_does_not_wait_for_a_victim_to_end():
    """x has 400 s unsaved on 8 GPUs and ends 100 s later by its estimate: with nowhere else to
    start, core would wait those 100 s rather than throw the work away (within its 5 min
    target, `test_tier1_waits_only_within_its_five_minute_target`); with the A100s free it
    would wait by choice, so it stops x at once instead (S1)."""
    decisions = core_at(fast_taken_slow_free(walltime=500.0), 400.0)
    assert preempts(decisions)["x"].grace_s == 0.0
    assert starts(decisions)["core"].allocation.gpu_type == "H100"


def test_a_tier1_job_that_could_start_on_a_fast_enough_free_type_does_not_wait_for_a_save():
    """At 2 h x would throw away 16 GPU-hours: alone on the H100s it would save first, and so it
    does where the free A100s run core at a quarter of the speed (too slow to start there,
    S7's `slower_type_min_speed`); at half the speed core could start there at once, so it
    would wait for the save by choice: x stops at once and core starts on the H100s (S1)."""
    slow = core_at(fast_taken_slow_free(walltime=None), 7200.0, a100_speed=0.25)
    assert preempts(slow)["x"].grace_s == 60.0 and "core" not in starts(slow)
    decisions = core_at(fast_taken_slow_free(walltime=None), 7200.0, a100_speed=0.5)
    assert preempts(decisions)["x"].grace_s == 0.0
    assert starts(decisions)["core"].allocation.gpu_type == "H100"
