"""Arbiter weighs the work a preemption throws away against the preemptor's expected wait.

A tier-3 victim of a tier-2 or tier-3 job is asked to save first (it stops within
`EngineConfig.notice_stop_s` and loses nothing); only where jobs cannot save on notice
(`notice_stop_s` = 0), and for a tier-1 preemptor (S1: at once), is unsaved work lost and
weighed."""

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


def test_a_tier1_job_still_stops_tier3_at_once():
    sched = borrowed_tier3(walltime=None, config=EngineConfig())
    sched.submit(job("core", team="a", tier=1, gpus=8), 1000.0)
    decisions = cycle(sched, 1000.0)
    assert preempts(decisions)["x"].grace_s == 0.0 and "core" in starts(decisions)
