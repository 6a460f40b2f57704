"""Failed searches are remembered only while nothing they looked at has changed."""

from __future__ import annotations

from gpu_arbiter.domain import Preempt, Team
from gpu_arbiter.domain.presets import small
from gpu_arbiter.engine import Scheduler
from gpu_arbiter.engine.memo import FailureMemo
from gpu_arbiter.engine.policies.arbiter import ArbiterPolicy
from tests.conftest import job
from tests.engine.helpers import cluster


def test_a_failure_stands_for_larger_requests_under_the_same_stamp_only():
    memo = FailureMemo()
    memo.record("sig", 8, stamp=1)
    assert memo.failed("sig", 8, 1) and memo.failed("sig", 16, 1)
    assert not memo.failed("sig", 4, 1)  # smaller may fit
    assert not memo.failed("sig", 8, 2)  # the state changed
    memo.record("sig", 4, stamp=1)
    assert memo.failed("sig", 4, 1)


def test_a_blocked_job_starts_as_soon_as_gpus_of_its_type_free_up():
    c = small()
    sched = Scheduler(c, (), "arbiter")
    total = c.total_gpus
    sched.submit(job("big", gpus=total, duration=100.0), 0.0)
    sched.cycle(0.0)
    sched.submit(job("next", gpus=8, duration=100.0), 1.0)
    for t in (1.0, 2.0, 3.0):  # blocked, and remembered as blocked
        assert sched.cycle(t).started == 0
    assert sched.set_aside("next") is not None
    sched.finished("big", 4.0)
    assert sched.cycle(4.0).started == 1
    assert sched.jobs["next"].state.value == "running"


def test_a_job_started_at_this_time_becomes_a_victim_once_time_has_passed():
    c = small()
    sched = Scheduler(c, (), "arbiter")
    sched.submit(job("low", tier=3, gpus=c.total_gpus, duration=1e6), 0.0)
    sched.cycle(0.0)
    sched.submit(job("high", tier=2, gpus=8, duration=100.0), 0.0)
    sched.cycle(0.0)  # low started at 0: no victim at 0, and high is remembered as blocked
    assert sched.jobs["high"].state.value == "pending"
    result = sched.cycle(1.0)
    assert any(d.job_id == "low" for d in result.decisions)  # preempted now


def test_a_job_with_no_way_to_start_is_remembered_until_gpus_free_up_on_its_type():
    """Team a's tier-3 job asks for more than a's quota leaves it while the cluster is full, so
    it may neither be placed nor reclaim: remembered as hopeless (tier 3 stopping longer tier-3
    jobs is off). A small job of a's ending frees too few GPUs to place it, but puts it back
    within a's quota: it reclaims from team b's borrowed job in that very cycle (which saves and
    stops within a minute)."""
    c = small()
    teams = [Team("a", quota={"H100": 32}), Team("b", quota={})]
    sched = Scheduler(c, teams, ArbiterPolicy(time_share=False))
    sched.submit(job("a-long", team="a", gpus=16, duration=1e6), 0.0)
    sched.submit(job("a-short", team="a", gpus=8, duration=5.0), 0.0)
    sched.submit(job("b-borrower", team="b", gpus=40, duration=1e6), 0.0)
    assert sched.cycle(0.0).started == 3
    # Ahead of it a job that stays hopeless, so a-more is not the first look on H100 (that one
    # is always a full look: it makes the type's reservation).
    sched.submit(job("a-whole", team="a", gpus=c.total_gpus, duration=100.0), 1.0)
    sched.submit(job("a-more", team="a", gpus=16, duration=100.0, walltime_s=200.0), 1.0)
    for t in (1.0, 2.0, 3.0):
        assert sched.cycle(t).started == 0
    assert sched.set_aside("a-more") == "hopeless"
    sched.finished("a-short", 5.0)
    result = sched.cycle(5.0)
    assert [d.job_id for d in result.decisions if isinstance(d, Preempt)] == ["b-borrower"]
    assert "a-more" in sched.holds
    sched.stopped("b-borrower", 65.0)
    sched.cycle(65.0)
    assert sched.jobs["a-more"].state.value == "running"


def test_jobs_that_can_start_nowhere_are_not_tried_again_for_a_type_none_of_them_reserves():
    """Team a's tier-3 jobs accept both types, but team b fills the cluster within its quota:
    they can start nowhere (hopeless). A failed try reserves only the first type it would
    take, so the slow type stays unreserved; a release that frees too few GPUs for any of
    them must not send them through a whole try again (it did, once per cycle, in long
    queues), and the first of them still reserves the fast type, as its try would. GPUs
    enough for them still start them."""
    c = cluster(
        {"name": "fast", "nodes": 1, "gpu_type": "H100"},
        {"name": "slow", "nodes": 1, "gpu_type": "A100"},
    )
    teams = [Team("a", quota={}), Team("b", quota={"H100": 8, "A100": 8})]
    sched = Scheduler(c, teams, "arbiter")
    for name, gpus, duration, gpu_type in (
        ("b-fast", 8, 1e6, "H100"),
        ("b-slow", 6, 50.0, "A100"),
        ("b-short", 2, 5.0, "A100"),
    ):
        spec = job(name, team="b", tier=2, gpus=gpus, duration=duration, gpu_types={gpu_type: 1})
        sched.submit(spec, 0.0)
    assert sched.cycle(0.0).started == 3
    both = {"H100": 1.0, "A100": 0.87}
    names = [f"a-{i}" for i in range(4)]
    for name in names:
        sched.submit(job(name, gpus=4, gpu_types=both, walltime_s=200.0), 1.0)
    assert sched.cycle(1.0).started == 0
    assert all(sched.set_aside(n) == "hopeless" for n in names)
    assert set(sched.reservations) == {"H100"}

    sched.finished("b-short", 5.0)  # 2 A100s free: too few for any of them
    assert sched.cycle(5.0).started == 0
    assert not any(sched.last_try[n] == 5.0 for n in names)  # none of them got a try
    assert {t: r.job_id for t, r in sched.reservations.items()} == {"H100": "a-0"}
    sched.finished("b-slow", 50.0)
    assert sched.cycle(50.0).started == 2  # 8 A100s free: two of them start there


def two_types():
    return cluster(
        {"name": "fast", "nodes": 1, "gpu_type": "H100"},
        {"name": "slow", "nodes": 1, "gpu_type": "A100"},
    )


def test_a_job_kept_off_one_type_by_a_reservation_starts_once_the_other_has_room():
    """Backfill: "late" may not delay "wide"'s reserved start on the H100s (it ends after the
    shadow time) and finds the A100s full, though it would end before the A100 reservation's
    shadow time: set aside. A short A100 job ending leaves room enough: it starts there."""
    sched = Scheduler(two_types(), (), "backfill")
    for name, gpus, duration, gpu_type in (
        ("long", 6, 1000.0, "H100"),
        ("a100-long", 6, 10_000.0, "A100"),
        ("a100-short", 2, 50.0, "A100"),
    ):
        spec = job(name, gpus=gpus, duration=duration, walltime_s=duration, gpu_types={gpu_type: 1})
        sched.submit(spec, 0.0)
    assert sched.cycle(0.0).started == 3
    sched.submit(job("wide", gpus=8, walltime_s=100.0, gpu_types={"H100": 1}), 1.0)
    sched.submit(job("a100-wide", gpus=8, walltime_s=100.0, gpu_types={"A100": 1}), 1.0)
    both = {"H100": 1.0, "A100": 0.87}
    sched.submit(job("late", gpus=2, duration=10.0, walltime_s=5000.0, gpu_types=both), 2.0)
    for t in (2.0, 3.0, 4.0):
        assert sched.cycle(t).started == 0
    assert sched.set_aside("late") == "blocked"
    assert {t: r.job_id for t, r in sched.reservations.items()} == {
        "H100": "wide",
        "A100": "a100-wide",
    }
    sched.finished("a100-short", 50.0)
    decisions = sched.cycle(50.0).decisions
    assert [(d.job_id, d.allocation.gpu_type) for d in decisions] == [("late", "A100")]


def test_a_job_that_can_start_nowhere_under_backfill_waits_for_free_gpus_not_releases():
    """Without quotas or preemption only GPUs freed in number can end a hopeless wait: a job of
    its own team ending with too few GPUs freed gives it no try."""
    sched = Scheduler(two_types(), (), "backfill")
    for name, gpus, duration, gpu_type in (
        ("h100-all", 8, 1e6, "H100"),
        ("a100-most", 6, 1e6, "A100"),
        ("a100-short", 2, 5.0, "A100"),
    ):
        sched.submit(job(name, gpus=gpus, duration=duration, gpu_types={gpu_type: 1}), 0.0)
    assert sched.cycle(0.0).started == 3
    both = {"H100": 1.0, "A100": 0.87}
    sched.submit(job("big", gpus=4, walltime_s=200.0, gpu_types=both), 1.0)
    assert sched.cycle(1.0).started == 0
    assert sched.set_aside("big") == "hopeless"
    sched.finished("a100-short", 5.0)  # its team's release, 2 A100s free: too few
    assert sched.cycle(5.0).started == 0
    assert sched.last_try["big"] == 1.0  # no try since
    assert sched.set_aside("big") == "hopeless"


def test_a_job_kept_off_by_a_reservation_starts_when_a_smaller_one_takes_its_place():
    """Backfill: "holder" can start nowhere and reserves the H100s until t=1000; "late" may not
    delay that (it ends after it, and no GPU is spare). When the A100s free up, "holder" starts
    there and "second", walked next, reserves the H100s for 4 GPUs, which leaves 4 spare at the
    same shadow time: "late" takes 2 of them in that very cycle, though nothing started or
    stopped on the H100s."""
    sched = Scheduler(two_types(), (), "backfill")
    for name, gpus, duration, gpu_type in (
        ("h100-long", 6, 1000.0, "H100"),
        ("a100", 8, 50.0, "A100"),
    ):
        spec = job(name, gpus=gpus, duration=duration, walltime_s=duration, gpu_types={gpu_type: 1})
        sched.submit(spec, 0.0)
    assert sched.cycle(0.0).started == 2
    both = {"H100": 1.0, "A100": 0.87}
    sched.submit(job("holder", gpus=8, walltime_s=100.0, gpu_types=both), 1.0)
    sched.submit(job("second", gpus=4, walltime_s=100.0, gpu_types={"H100": 1}), 2.0)
    sched.submit(job("late", gpus=2, duration=10.0, walltime_s=5000.0, gpu_types={"H100": 1}), 3.0)
    for t in (3.0, 4.0, 5.0):
        assert sched.cycle(t).started == 0
    assert {t: r.job_id for t, r in sched.reservations.items()} == {"H100": "holder"}
    assert sched.set_aside("late") == "blocked"
    sched.finished("a100", 50.0)
    decisions = sched.cycle(50.0).decisions
    assert {d.job_id: d.allocation.gpu_type for d in decisions} == {
        "holder": "A100",
        "late": "H100",
    }
    assert sched.reservations["H100"].job_id == "second"


def test_a_job_whose_only_victims_belong_to_a_team_served_less_is_set_aside_as_hopeless():
    """Team a's tier-3 job, beyond a's quota, outranks team b's long-running tier-3 job by
    queue, but b is served less than a (rule 5): nobody on the type is a victim for it, so it
    is set aside as hopeless (not searched for victims on every change there) and starts once
    GPUs free up."""
    c = cluster({"name": "r", "nodes": 2})
    teams = [Team("a", weight=1.0, quota={}), Team("b", weight=4.0, quota={})]
    sched = Scheduler(c, teams, "arbiter")
    sched.submit(job("b-old", team="b", gpus=8, duration=1e6), 0.0)
    assert sched.cycle(0.0).started == 1
    sched.submit(job("a-young", team="a", gpus=8, duration=200.0), 900.0)
    assert sched.cycle(900.0).started == 1
    # b-old has attained 8,000 GPU-seconds (a lower-priority queue), a-new none.
    sched.submit(job("a-new", team="a", gpus=8, duration=100.0), 1000.0)
    for t in (1000.0, 1001.0, 1002.0):
        assert not sched.cycle(t).decisions
    assert sched.set_aside("a-new") == "hopeless"
    sched.finished("a-young", 1100.0)
    sched.cycle(1100.0)
    assert sched.jobs["a-new"].state.value == "running"


def test_a_job_that_may_suspend_nobody_is_not_woken_by_starts_on_its_type():
    """Team a's tier-3 job, suspended after 10 GPU-hours (the last queue) and beyond a's
    quota, may take GPUs from nobody: no start on its type can give it a victim, so a tier-3
    job of team b starting there gives it no try; GPUs freed in number do, and it starts."""
    c = cluster({"name": "r", "nodes": 2})
    teams = [Team("a", weight=1.0, quota={}), Team("b", weight=4.0, quota={})]
    sched = Scheduler(c, teams, "arbiter")
    sched.submit(job("a-heavy", team="a", gpus=8, duration=1e6), 0.0)
    sched.submit(job("b-long", team="b", gpus=4, duration=1e6), 0.0)
    sched.submit(job("b-short", team="b", gpus=4, duration=6000.0), 0.0)
    assert sched.cycle(0.0).started == 3
    # a-heavy has attained 36,800 GPU-seconds: a-new (none) suspends it, its only victim.
    sched.submit(job("a-new", team="a", gpus=8, duration=3000.0), 4600.0)
    suspended = [d.job_id for d in sched.cycle(4600.0).decisions if isinstance(d, Preempt)]
    assert suspended == ["a-heavy"]
    sched.stopped("a-heavy", 4660.0)
    sched.cycle(4660.0)
    assert sched.jobs["a-new"].state.value == "running"
    sched.cycle(4661.0)
    assert sched.set_aside("a-heavy") == "hopeless"
    tried = sched.last_try["a-heavy"]
    sched.finished("b-short", 6000.0)  # 4 GPUs free: too few for a-heavy
    sched.submit(job("b-next", team="b", gpus=4, duration=1e6), 6000.0)
    assert [d.job_id for d in sched.cycle(6000.0).decisions] == ["b-next"]
    sched.cycle(6001.0)
    assert sched.last_try["a-heavy"] == tried  # no try since
    assert sched.set_aside("a-heavy") == "hopeless"
    sched.finished("a-new", 7660.0)
    sched.cycle(7660.0)
    assert sched.jobs["a-heavy"].state.value == "running"
