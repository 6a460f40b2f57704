"""Who is stopped to make room (S1, S2, S8): tiers, grace, reclaim, and the power victims free."""

import pytest

from gpu_arbiter.domain import Team, Tier
from gpu_arbiter.engine import EngineConfig, Scheduler
from gpu_arbiter.engine.capacity import CapacityIndex
from gpu_arbiter.engine.placement import Request
from gpu_arbiter.engine.preemption import plan_preemption, victim_options
from tests.conftest import job
from tests.engine.helpers import cluster, cycle, node_of, preempts, resizes, starts


def one_rack(nodes: int = 2, cap_kw: float = 40.0):
    return cluster({"name": "r0", "nodes": nodes, "power_cap_kw": cap_kw})


def test_tier1_on_a_full_cluster_of_tier3_starts_in_the_same_cycle_and_victims_stop_at_once():
    sched = Scheduler(one_rack(), [Team("a", quota={"H100": 8}), Team("b", quota={"H100": 8})])
    for i in range(4):
        sched.submit(job(f"x{i}", team="b", tier=3, gpus=4, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("core", team="a", tier=1, gpus=8), 10.0)
    decisions = cycle(sched, 10.0)
    assert "core" in starts(decisions)
    victims = preempts(decisions)
    assert len(victims) == 2
    assert all(p.grace_s == 0 and not p.checkpoint for p in victims.values())
    assert all(p.for_job == "core" for p in victims.values())


def test_tier2_victims_get_the_grace_and_the_preemptor_starts_only_once_they_stopped():
    sched = Scheduler(one_rack(nodes=1), [Team("a", quota={"H100": 4}), Team("b")])
    sched.submit(job("biz", team="b", tier=2, gpus=8, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("core", team="a", tier=1, gpus=4), 10.0)
    decisions = cycle(sched, 10.0)
    order = preempts(decisions)["biz"]
    assert order.grace_s == 7200.0 and order.checkpoint
    assert "core" not in starts(decisions) and "core" in sched.holds
    sched.stopped("biz", 7210.0)
    assert "core" in starts(cycle(sched, 7210.0))
    assert sched.jobs["biz"].progress_s == 7210.0  # the checkpoint it was asked for kept it all


def test_a_victim_that_finishes_during_its_grace_is_no_longer_waited_for():
    sched = Scheduler(one_rack(nodes=1), [Team("a", quota={"H100": 4}), Team("b")])
    sched.submit(job("biz", team="b", tier=2, gpus=8, duration=100.0), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("core", team="a", tier=1, gpus=4), 10.0)
    assert "biz" in preempts(cycle(sched, 10.0))
    sched.finished("biz", 100.0)
    assert "biz" not in sched.pending_stops
    assert "core" in starts(cycle(sched, 100.0))


def test_the_tier2_victim_expected_to_end_soonest_is_noticed_even_if_it_has_more_unsaved_work():
    """Where jobs run on until their grace ends (`notice_stop_s` = the grace): waiting for
    "soon" alone is not enough (the gang needs 16 GPUs), so two are noticed: "soon" frees its
    GPUs at 2000 s, long before the grace ends, at no cost to anyone."""
    sched = Scheduler(
        one_rack(nodes=3),
        [Team("a", quota={"H100": 16}), Team("b")],
        config=EngineConfig(notice_stop_s=7200.0),
    )
    sched.submit(job("soon", team="b", tier=2, gpus=8, duration=2000.0, walltime_s=2000.0), 0.0)
    cycle(sched, 0.0)
    for i in range(2):
        sched.submit(job(f"late{i}", team="b", tier=2, gpus=8, duration=1e5), 500.0)
    cycle(sched, 500.0)
    sched.submit(job("core", team="a", tier=1, gpus=16), 1000.0)
    victims = set(preempts(cycle(sched, 1000.0)))
    assert "soon" in victims and len(victims) == 2


def test_gpus_held_for_a_preemptor_are_taken_by_nobody_else_during_the_grace():
    sched = Scheduler(one_rack(nodes=1), [Team("a", quota={"H100": 4}), Team("b")])
    sched.submit(job("biz", team="b", tier=2, gpus=6, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("core", team="a", tier=1, gpus=8), 10.0)
    cycle(sched, 10.0)
    assert sched.index.total_free == 0  # the two free GPUs are held for "core"
    sched.submit(job("small", team="a", tier=3, gpus=1), 20.0)
    assert "small" not in starts(cycle(sched, 20.0))
    sched.stopped("biz", 7210.0)
    decisions = cycle(sched, 7210.0)
    assert "core" in starts(decisions) and "small" not in starts(decisions)


def test_tier1_jobs_are_never_preempted_even_by_tier1():
    sched = Scheduler(one_rack(nodes=1))
    sched.submit(job("first", tier=1, gpus=8, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("second", team="b", tier=1, gpus=8), 10.0)
    assert cycle(sched, 10.0) == []


def test_a_team_within_quota_reclaims_another_teams_borrowed_job_of_any_tier():
    teams = [Team("a", quota={"H100": 8}), Team("b", quota={"H100": 8})]
    sched = Scheduler(one_rack(), teams)
    sched.submit(job("b-own", team="b", tier=2, gpus=8, duration=1e5), 0.0)
    sched.submit(job("b-borrow", team="b", tier=2, gpus=8, duration=1e5), 1.0)
    cycle(sched, 1.0)
    assert sched.jobs["b-borrow"].borrowed and not sched.jobs["b-own"].borrowed
    sched.submit(job("a-mine", team="a", tier=3, gpus=8), 10.0)
    decisions = cycle(sched, 10.0)
    order = preempts(decisions)["b-borrow"]
    assert "reclaimed by team a" in order.reason and order.grace_s == 7200.0
    assert "b-own" not in preempts(decisions)


def test_a_team_beyond_its_quota_cannot_take_another_teams_guaranteed_gpus_by_tier():
    teams = [Team("a", quota={"H100": 8}), Team("b", quota={"H100": 8})]
    sched = Scheduler(one_rack(), teams)
    sched.submit(job("a-own", team="a", tier=2, gpus=8, duration=1e5), 0.0)
    sched.submit(job("b-own", team="b", tier=3, gpus=8, duration=1e5), 0.0)
    cycle(sched, 0.0)
    assert not sched.jobs["b-own"].borrowed
    sched.submit(job("a-more", team="a", tier=2, gpus=8), 10.0)
    assert cycle(sched, 10.0) == []


def scattered_guarantees(victim_tier: int) -> Scheduler:
    """16 GPUs: a is guaranteed 2, b and c 5 each, the pool is 4. b and c run one-GPU jobs of
    `victim_tier`, all within their guarantees, spread so that each node has 3 free GPUs: the
    6 free GPUs are a's guarantee and the pool by count, yet no node has 4."""
    teams = [
        Team("a", quota={"H100": 2}),
        Team("b", quota={"H100": 5}),
        Team("c", quota={"H100": 5}),
    ]
    sched = Scheduler(one_rack(), teams)
    owners = {0: "bbbcc", 1: "bbccc"}
    for node, teams_there in owners.items():
        for i in range(8):
            team = teams_there[i] if i < len(teams_there) else "a"
            sched.submit(job(f"n{node}-{i}-{team}", team=team, tier=victim_tier, duration=1e5), 0.0)
    cycle(sched, 0.0)
    for j in [j for j in sched.running if j.endswith("-a")]:
        sched.finished(j, 1.0)
    assert [sched.index.free[n] for n in (0, 1)] == [3, 3]
    assert not any(v.borrowed for v in sched.running.values())
    return sched


def test_tier1_within_its_guarantee_and_the_pool_stops_tier3_of_other_teams_guarantees():
    """S1 over S2: admission holds a tier-1 job to its guarantee and the pool, so its GPUs
    exist by count; when they lie scattered it may stop other teams' tier-3 jobs to get a
    node, and those teams find their guarantee on the GPUs it left free."""
    sched = scattered_guarantees(victim_tier=3)
    sched.submit(job("core", team="a", tier=1, gpus=4, tp_size=4, duration=1e5), 2.0)
    decisions = cycle(sched, 2.0)
    (victim,) = preempts(decisions).values()  # the cheapest: one GPU, stopped at once
    assert victim.grace_s == 0 and victim.for_job == "core"
    assert "core" in starts(decisions) and sched.jobs["core"].borrowed
    assert victim.job_id in starts(cycle(sched, 3.0))  # back within its guarantee, elsewhere
    assert not sched.jobs[victim.job_id].borrowed


def test_tier1_within_its_guarantee_and_the_pool_gives_tier2_of_other_teams_notice():
    sched = scattered_guarantees(victim_tier=2)
    sched.submit(job("core", team="a", tier=1, gpus=4, tp_size=4, duration=1e5), 2.0)
    decisions = cycle(sched, 2.0)
    (victim,) = preempts(decisions).values()
    assert victim.grace_s == 7200.0 and victim.checkpoint and victim.for_job == "core"
    assert "core" in sched.holds


def test_tier1_borrows_only_from_the_unowned_pool():
    # 16 GPUs: a and b are guaranteed 6 each, 4 are nobody's.
    teams = [Team("a", quota={"H100": 6}), Team("b", quota={"H100": 6})]
    sched = Scheduler(one_rack(), teams, config=EngineConfig(tier1_borrows_at_tier2=False))
    sched.submit(job("big", team="a", tier=1, gpus=10, duration=1e5), 0.0)
    assert "big" in starts(cycle(sched, 0.0))
    sched.submit(job("more", team="a", tier=1, gpus=2), 1.0)
    assert cycle(sched, 1.0) == []  # 6 + 4 used: the rest of the cluster is b's guarantee
    assert sched.index.total_free == 6


def test_tier1_beyond_its_guarantee_and_the_pool_borrows_at_tier2_and_is_reclaimed_with_notice():
    teams = [Team("a", quota={"H100": 6}), Team("b", quota={"H100": 6})]
    sched = Scheduler(one_rack(), teams)
    sched.submit(job("big", team="a", tier=1, gpus=10, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("more", team="a", tier=1, gpus=2, duration=1e5), 1.0)
    assert "more" in starts(cycle(sched, 1.0))  # on b's idle guarantee, rather than wait
    more = sched.jobs["more"]
    assert more.tier == Tier.BUSINESS and more.borrowed and more.borrows_at_tier2
    sched.submit(job("owner", team="b", tier=2, gpus=6), 2.0)
    order = preempts(cycle(sched, 2.0))["more"]  # b reclaims its guarantee, with S1's notice
    assert order.grace_s == 7200.0 and order.checkpoint and order.for_job == "owner"
    assert sched.jobs["big"].state.value == "running"  # tier 1 at tier 1 is never a victim
    sched.stopped("more", 62.0)
    assert more.tier == Tier.CORE and not more.borrows_at_tier2  # queued at its own tier again
    assert "more" in sched.queue


def borrowed_half(c_tier: int) -> Scheduler:
    """16 GPUs: b is guaranteed 10 and runs 8 of them; c, guaranteed nothing, borrows the other
    8 with a job of `c_tier`; a is guaranteed 2, and the pool is 4."""
    teams = [Team("a", quota={"H100": 2}), Team("b", quota={"H100": 10}), Team("c")]
    sched = Scheduler(one_rack(), teams)
    sched.submit(job("b-own", team="b", tier=2, gpus=8, duration=1e5), 0.0)
    sched.submit(job("c-job", team="c", tier=c_tier, gpus=8, duration=1e5), 0.0)
    assert set(starts(cycle(sched, 0.0))) == {"b-own", "c-job"}
    assert sched.jobs["c-job"].borrowed
    # More than a's guarantee plus the pool: a tier-1 job that can only run at tier 2.
    sched.submit(job("core", team="a", tier=1, gpus=8, duration=1e5), 1.0)
    return sched


def test_tier1_borrowing_at_tier2_goes_before_tier2_borrowers_of_other_teams():
    sched = borrowed_half(c_tier=2)
    order = preempts(cycle(sched, 1.0))  # tier 1 before tier 2, with S1's notice
    assert set(order) == {"c-job"}  # never b's job on b's own guarantee
    assert order["c-job"].for_job == "core" and order["c-job"].grace_s == 7200.0
    sched.stopped("c-job", 61.0)
    assert "core" in starts(cycle(sched, 61.0))
    assert sched.jobs["core"].borrows_at_tier2


def test_tier1_borrowing_at_tier2_does_not_take_from_tier1_jobs_that_borrow():
    sched = borrowed_half(c_tier=1)
    assert sched.jobs["c-job"].borrows_at_tier2  # also beyond its guarantee and the pool
    assert preempts(cycle(sched, 1.0)) == {}
    core = sched.jobs["core"]
    assert core.tier == 1 and not core.borrows_at_tier2  # queued at tier 1 again


def test_tier1_that_fits_its_guarantee_or_the_pool_never_runs_at_tier2():
    teams = [Team("a", quota={"H100": 6}), Team("b", quota={"H100": 6})]
    sched = Scheduler(one_rack(), teams)
    sched.submit(job("core", team="a", tier=1, gpus=8), 0.0)  # 6 guaranteed + 2 of the pool
    assert "core" in starts(cycle(sched, 0.0))
    assert sched.jobs["core"].tier == Tier.CORE and not sched.jobs["core"].borrows_at_tier2


def test_a_tier1_job_larger_than_its_quota_plus_the_pool_queues_at_tier1_and_runs_at_tier2():
    teams = [Team("a", quota={"H100": 6}), Team("b", quota={"H100": 6})]
    sched = Scheduler(one_rack(), teams)
    sched.submit(job("x", team="b", tier=3, gpus=8, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("biz", team="b", tier=2, gpus=8), 1.0)  # fits the free half at once
    huge = sched.submit(job("huge", team="a", tier=1, gpus=12), 1.0)  # > 6 guaranteed + 4
    assert huge.tier == Tier.CORE  # walked with tier 1, ahead of biz
    decisions = cycle(sched, 1.0)
    order = preempts(decisions)["x"]  # tier-2 rights: a tier-3 borrower saves and stops
    assert order.for_job == "huge" and order.grace_s > 0
    assert "biz" not in starts(decisions)  # the free half is held for huge
    sched.stopped("x", 61.0)
    assert "huge" in starts(cycle(sched, 61.0))
    assert huge.tier == Tier.BUSINESS and huge.borrowed and huge.borrows_at_tier2


def test_a_tier1_job_the_pool_cannot_hold_now_borrows_at_tier2_rather_than_wait():
    """Another team's tier-1 job holds most of the pool, and no GPU is free: a tier-1 job
    beyond its guarantee stops tier-3 borrowers as a tier-2 job of its team would, rather than
    wait for the pool (msr ee9e8c: a 2-min tier-1 job waited 8 h while tier-3 jobs ran)."""
    # 24 GPUs: a, b and d are guaranteed 4, 4 and 8; the pool is 8.
    teams = [
        Team("a", quota={"H100": 4}),
        Team("b", quota={"H100": 4}),
        Team("d", quota={"H100": 8}),
    ]
    sched = Scheduler(one_rack(nodes=3, cap_kw=100.0), [*teams, Team("c")])
    sched.submit(job("b-core", team="b", tier=1, gpus=8, duration=1e5), 0.0)  # 4 of the pool
    for name in ("x1", "x2"):
        sched.submit(job(name, team="c", tier=3, gpus=8, duration=1e5), 0.0)
    assert set(starts(cycle(sched, 0.0))) == {"b-core", "x1", "x2"}
    core = sched.submit(job("core", team="a", tier=1, gpus=10, duration=1e5), 1.0)  # 4 + 6
    order = preempts(cycle(sched, 1.0))
    assert set(order) == {"x1", "x2"} and all(p.for_job == "core" for p in order.values())
    assert sched.jobs["b-core"].state.value == "running"
    sched.stopped("x1", 61.0)
    sched.stopped("x2", 61.0)
    assert "core" in starts(cycle(sched, 61.0))
    assert core.tier == Tier.BUSINESS and core.borrowed and core.borrows_at_tier2


def test_without_tier2_borrowing_a_tier1_job_larger_than_its_quota_plus_the_pool_is_tier2():
    teams = [Team("a", quota={"H100": 6}), Team("b", quota={"H100": 6})]
    sched = Scheduler(one_rack(), teams, config=EngineConfig(tier1_borrows_at_tier2=False))
    assert sched.submit(job("huge", team="a", tier=1, gpus=12), 0.0).tier == Tier.BUSINESS


def test_elastic_victims_shrink_before_anyone_is_stopped():
    sched = Scheduler(one_rack(nodes=1))
    sched.submit(job("el", team="b", tier=3, gpus=4, min_gpus=2, max_gpus=6, duration=1e5), 0.0)
    sched.submit(job("fixed", team="b", tier=3, gpus=2, duration=1e5), 0.0)
    cycle(sched, 0.0)
    assert sched.jobs["el"].gpus_held == 6
    sched.submit(job("core", team="a", tier=1, gpus=4), 10.0)
    decisions = cycle(sched, 10.0)
    assert "core" in starts(decisions)
    assert resizes(decisions)["el"].allocation.gpus == 2
    assert preempts(decisions) == {}


def test_a_victim_that_frees_only_power_is_stopped_too():
    """Found by the power property: the preemptor fits on other GPUs of the rack once the
    victim's power is released; sparing the victim would overdraw the rack's cap."""
    # 2 nodes × 8 H100; the cap powers 10 GPUs at the normal profile (560 W each).
    sched = Scheduler(one_rack(cap_kw=2.0 + 10 * 0.56))
    sched.submit(job("a6", tier=1, gpus=6, duration=1e5), 0.0)
    sched.submit(job("x4", team="b", tier=3, gpus=4, duration=1e5), 0.0)
    cycle(sched, 0.0)
    assert sched.index.power_headroom(0) < 560
    sched.submit(job("core", tier=1, gpus=2), 10.0)
    decisions = cycle(sched, 10.0)
    assert "core" in starts(decisions)
    assert set(preempts(decisions)) == {"x4"}


def fast_and_slow(notice_stop_s: float) -> Scheduler:
    """A node of H100s and one of A100s; team a owns one of each, team b nothing."""
    c = cluster(
        {"name": "fast", "nodes": 1, "gpu_type": "H100"},
        {"name": "slow", "nodes": 1, "gpu_type": "A100"},
    )
    teams = [Team("a", quota={"H100": 8, "A100": 8}), Team("b")]
    return Scheduler(c, teams, config=EngineConfig(notice_stop_s=notice_stop_s))


@pytest.mark.parametrize(
    ("tier", "a100_free_at", "notice_stop_s", "preempted"),
    [
        (2, 600.0, 7200.0, False),
        (2, 7200.0, 7200.0, True),
        (1, 600.0, 7200.0, True),
        (2, 600.0, 60.0, True),
    ],
)
def test_a_job_waits_for_a_slower_type_instead_of_giving_notice_when_it_finishes_no_later(
    tier, a100_free_at, notice_stop_s, preempted
):
    """Where victims run on until their 2 h grace ends, notice on the H100s means starting at
    7200 s and ending 3600 s later. The A100s free up at `a100_free_at`, where the job runs at
    half speed: starting at 600 s and ending at 600 + 7200 s is no later, so it waits there and
    nobody is stopped; 7200 + 7200 s is later, so biz gets its notice. Where victims save and
    stop within a minute, the notice wins. A tier-1 job never waits on estimates (S1 queueing
    target)."""
    sched = fast_and_slow(notice_stop_s)
    sched.submit(job("biz", team="b", tier=2, gpus=8, duration=1e5, gpu_types={"H100": 1.0}), 0.0)
    end = {"duration": a100_free_at, "walltime_s": a100_free_at, "gpu_types": {"A100": 1.0}}
    sched.submit(job("soon", team="b", tier=2, gpus=8, **end), 0.0)
    cycle(sched, 0.0)
    speeds = {"H100": 1.0, "A100": 0.5}
    sched.submit(job("mine", tier=tier, gpus=8, walltime_s=3600.0, gpu_types=speeds), 10.0)
    assert ("biz" in preempts(cycle(sched, 10.0))) is preempted
    if not preempted:
        sched.finished("soon", a100_free_at)
        assert starts(cycle(sched, a100_free_at))["mine"].allocation.gpu_type == "A100"


@pytest.mark.parametrize(("notice_stop_s", "runs_on"), [(60.0, "H100"), (7200.0, "A100")])
def test_a_tier1_job_gives_notice_on_the_fast_type_rather_than_start_on_a_much_slower_one(
    notice_stop_s, runs_on
):
    """biz (tier 2, borrowing) fills the H100s; the A100s are free but 8x slower. When biz saves
    and stops within a minute, core waits that minute for the H100s (within its 5 min queueing
    target) instead of taking the A100s for good; when biz would run on for its 2 h grace,
    core starts on the A100s at once."""
    sched = fast_and_slow(notice_stop_s)
    sched.submit(job("biz", team="b", tier=2, gpus=8, duration=1e5, gpu_types={"H100": 1.0}), 0.0)
    cycle(sched, 0.0)
    speeds = {"H100": 1.0, "A100": 0.125}
    sched.submit(job("core", tier=1, gpus=8, walltime_s=36000.0, gpu_types=speeds), 10.0)
    decisions = cycle(sched, 10.0)
    if runs_on == "H100":
        assert preempts(decisions)["biz"].grace_s == 7200.0 and "core" not in starts(decisions)
        sched.stopped("biz", 70.0)
        decisions = cycle(sched, 70.0)
    assert starts(decisions)["core"].allocation.gpu_type == runs_on


@pytest.mark.parametrize(
    ("a100_speed", "notice_stop_s", "runs_on"),
    [(0.125, 60.0, "H100"), (0.9, 60.0, "H100"), (0.9, 7200.0, "A100")],
)
def test_a_tier1_job_stops_tier3_at_once_on_a_slower_type_only_if_it_finishes_no_later(
    a100_speed, notice_stop_s, runs_on
):
    """biz (tier 2) fills the H100s, x (tier 3, a minute old) the A100s. Stopping x starts
    core at once on the A100s; giving biz notice starts it on the H100s once biz has saved
    (`notice_stop_s`). 10 h of work take 80 h or 11.1 h on the A100s: after a minute's save
    the H100s finish it first; after biz's whole 2 h grace, 11.1 h at once is sooner."""
    sched = fast_and_slow(notice_stop_s)
    sched.submit(job("biz", team="b", tier=2, gpus=8, duration=1e5, gpu_types={"H100": 1.0}), 0.0)
    sched.submit(job("x", team="b", tier=3, gpus=8, duration=1e5, gpu_types={"A100": 1.0}), 0.0)
    cycle(sched, 0.0)
    speeds = {"H100": 1.0, "A100": a100_speed}
    sched.submit(job("core", tier=1, gpus=8, walltime_s=36000.0, gpu_types=speeds), 60.0)
    decisions = cycle(sched, 60.0)
    if runs_on == "H100":
        assert set(preempts(decisions)) == {"biz"} and "core" not in starts(decisions)
        sched.stopped("biz", 120.0)
        decisions = cycle(sched, 120.0)
    else:
        assert set(preempts(decisions)) == {"x"}
    assert starts(decisions)["core"].allocation.gpu_type == runs_on


def test_a_victim_whose_borrowed_flag_flips_in_the_cycle_stays_a_victim_as_it_is_now():
    """core1 stops b2, so b3 is no longer borrowed (b's quota holds b1 and b3). The victim
    list core1's search made has b3 as borrowed; core2 must find b3 as it is now, with less
    unsaved work than a0, not skip it as stale and stop a0."""
    sched = Scheduler(one_rack(), [Team("a", quota={"H100": 8}), Team("b", quota={"H100": 8})])
    sched.submit(job("a0", tier=3, gpus=4, duration=1e5), 0.0)
    sched.submit(job("b1", team="b", tier=2, gpus=4, duration=1e5), 0.0)
    sched.submit(job("b2", team="b", gpus=4, duration=1e5, checkpoint_interval_s=5.0), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("b3", team="b", gpus=4, duration=1e5), 10.0)
    cycle(sched, 10.0)
    assert sched.jobs["b3"].borrowed and not sched.jobs["b2"].borrowed
    for name in ("core1", "core2"):
        sched.submit(job(name, tier=1, gpus=4, duration=100.0), 100.0)
    decisions = cycle(sched, 100.0)
    assert set(preempts(decisions)) == {"b2", "b3"}
    assert {"core1", "core2"} <= set(starts(decisions))


def test_a_search_whose_victims_together_free_too_few_gpus_releases_none_of_them(monkeypatch):
    """The common failed search of a busy cluster costs a count, not a tentative release of
    every victim in the capacity index (and its undoing)."""
    sched = Scheduler(one_rack(nodes=1))
    sched.submit(job("x2", team="b", tier=3, gpus=2, duration=1e5), 0.0)
    sched.submit(job("a4", tier=1, gpus=4, duration=1e5), 0.0)
    cycle(sched, 0.0)
    index, x2 = sched.index, sched.jobs["x2"]
    option = victim_options([x2], False, 0.0, 10.0, lambda v: 0.0)
    released = []
    give = CapacityIndex.give
    monkeypatch.setattr(
        CapacityIndex,
        "give",
        lambda self, node, mask, w: (released.append(node), give(self, node, mask, w)),
    )

    assert plan_preemption(index, Request("H100", 5), option, "pack") is None
    assert released == []  # 2 free + 2 from x2 < 5: nothing to try
    plan = plan_preemption(index, Request("H100", 4), option, "pack")
    assert released == [0]
    assert plan is not None and [v.job.id for v in plan.victims] == ["x2"]


def test_free_gpus_that_suffice_by_count_but_not_on_one_node_do_not_hold_off_a_notice():
    """9 free G2 GPUs spread over nodes made a 4-GPU tier-1 pod on Alibaba expect a start "now"
    and wait 16 min rather than give a tier-2 pod its notice: no node had 4 free."""
    quotas = {"a": 8, "c": 4, "d": 4, "b": 0}
    sched = Scheduler(one_rack(), [Team(t, quota={"H100": q}) for t, q in quotas.items()])
    sched.submit(job("a1", team="a", tier=1, gpus=7, duration=1e5), 0.0)  # node 0: 1 free
    sched.submit(job("biz", team="b", tier=2, gpus=2, duration=1e5), 0.0)  # node 1 ...
    sched.submit(job("c1", team="c", tier=1, gpus=3, duration=1e5), 0.0)  # ... 3 free
    cycle(sched, 0.0)
    assert node_of(sched, "biz") == node_of(sched, "c1") != node_of(sched, "a1")
    sched.submit(job("core", team="d", tier=1, gpus=4), 10.0)
    order = preempts(cycle(sched, 10.0))["biz"]
    assert order.grace_s == 7200.0 and "core" in sched.holds


def test_of_victims_given_notice_the_one_expected_to_run_longest_goes_first():
    """Both save, so neither loses work: stopping "short" (less unsaved work, and the younger
    run) would push back a job with under 3 h left to spare one with days left."""
    sched = Scheduler(one_rack(nodes=1), [Team("a", quota={"H100": 4}), Team("b")])
    sched.submit(job("long", team="b", tier=2, gpus=4, duration=1e6, walltime_s=1e6), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("short", team="b", tier=2, gpus=4, duration=1e4, walltime_s=1e4), 100.0)
    cycle(sched, 100.0)
    sched.submit(job("core", team="a", tier=1, gpus=4), 1000.0)
    assert set(preempts(cycle(sched, 1000.0))) == {"long"}


def test_no_plan_counts_on_the_gpus_of_a_drained_node():
    sched = Scheduler(one_rack(), [Team("a", quota={"H100": 8}), Team("b", quota={"H100": 8})])
    for i in range(2):
        sched.submit(job(f"x{i}", team="b", tier=3, gpus=8, duration=1e5), 0.0)
    cycle(sched, 0.0)
    drained = node_of(sched, "x1")[0]
    sched.drain(drained)
    sched.submit(job("core", team="a", tier=1, gpus=8), 10.0)
    decisions = cycle(sched, 10.0)
    assert list(preempts(decisions)) == ["x0"]  # stopping x1 would free nothing
    assert node_of(sched, "core") != [drained]
