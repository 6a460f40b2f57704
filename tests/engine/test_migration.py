"""Moves of running jobs onto a faster accepted type (engine.migration) and the choice between
starting on a slow type now and waiting for a fast one (engine.typechoice), under Arbiter."""

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpu_arbiter.domain import Allocation, Preempt, Team
from gpu_arbiter.engine import EngineConfig, Scheduler
from gpu_arbiter.engine.backfill import Reservation
from gpu_arbiter.engine.migration import (
    MoveRules,
    finish_times,
    never_worth,
    way_for,
    worth_moving,
)
from gpu_arbiter.engine.policies.arbiter import ArbiterPolicy
from gpu_arbiter.sim import SimConfig, Simulator
from tests.conftest import job
from tests.engine.helpers import cluster, cycle, node_of, preempts, starts
from tests.engine.invariants import check_all

FLEX = {"H100": 1.0, "V100": 0.25}  # 4x faster on the H100
FAST_ONLY = {"H100": 1.0}


def two_types(nodes: int = 1):
    return cluster(
        {"name": "fast", "nodes": nodes, "gpu_type": "H100"},
        {"name": "slow", "nodes": nodes, "gpu_type": "V100"},
    )


# Jobs that cannot save on notice: a tier-3 job is moved at once and loses its unsaved work.
CANNOT_SAVE = EngineConfig(notice_stop_s=0.0)


def sched_with(policy=None, teams=(), config: EngineConfig = CANNOT_SAVE) -> Scheduler:
    """The scenarios below need a team's jobs walked in submission order (a blocker first)."""
    policy = policy or ArbiterPolicy(shortest_first=False)
    return Scheduler(two_types(), list(teams), policy, config)


QUOTA = [Team("a", quota={"H100": 8, "V100": 8})]


def on_slow_type(
    tier: int = 3, duration: float = 1e4, config: EngineConfig = CANNOT_SAVE, **kw
) -> Scheduler:
    """`x` runs on the V100s because a tier-1 job with no end in sight holds the H100s."""
    sched = sched_with(teams=QUOTA, config=config)
    sched.submit(job("blocker", tier=1, gpus=8, duration=1000.0, gpu_types=FAST_ONLY), 0.0)
    sched.submit(
        job("x", tier=tier, gpus=8, duration=duration, walltime_s=duration, gpu_types=FLEX, **kw),
        0.0,
    )
    assert starts(cycle(sched, 0.0))["x"].allocation.gpu_type == "V100"
    return sched


def test_finish_times_count_the_lost_work_and_the_restart():
    stay, move = finish_times(1000.0, 0.5, 0.0, 0.25, 1.0, 60.0)
    assert stay == pytest.approx(2000.0)  # 500 reference s left at 0.25
    assert move == pytest.approx(1060.0)  # all 1000 again at 1.0, plus the restart
    assert worth_moving(stay, move, MoveRules())
    assert not worth_moving(1000.0, 900.0, MoveRules())  # saves under 20 %


def test_a_grace_keeps_the_progress_made_while_waiting_it_out():
    _, move = finish_times(1000.0, 0.5, 0.0, 0.25, 1.0, 60.0, notice_s=400.0, duration_ref=1000.0)
    assert move == pytest.approx(400.0 + 60.0 + 400.0)  # 100 of the 500 left done meanwhile


@given(
    walltime=st.floats(100.0, 1e6),
    over=st.floats(1.0, 3.0),
    done=st.floats(0.0, 1.0),
    later=st.floats(0.0, 1.0),
    saved=st.floats(0.0, 1.0),
    rate=st.floats(0.05, 2.0),
    speedup=st.floats(1.0, 8.0),
    overhead=st.floats(0.0, 600.0),
    notice=st.one_of(st.none(), st.floats(0.0, 7200.0)),
)
def test_a_move_ruled_out_for_good_is_never_worth_it_later(
    walltime, over, done, later, saved, rate, speedup, overhead, notice
):
    """`never_worth` lets engine.migration skip a pair for the rest of the job's run, so no
    later progress (and no later checkpoint) may make the move worth it after all."""
    duration, rules = walltime / over, MoveRules()
    if not never_worth(walltime, done, rate, rate * speedup, overhead, notice, duration, rules):
        return
    d = done + (1 - done) * later
    stay, move = finish_times(
        walltime, d, d * saved, rate, rate * speedup, overhead, notice, duration
    )
    assert not worth_moving(stay, move, rules)


def test_a_small_speedup_is_ruled_out_for_good_and_a_large_one_is_not():
    rules = MoveRules()
    # 15 % faster can never save 20 % of the time staying takes.
    assert never_worth(1e5, 0.0, 0.87, 1.0, 60.0, 60.0, 5e4, rules)
    assert not never_worth(1e5, 0.0, 0.25, 1.0, 60.0, 60.0, 5e4, rules)
    assert never_worth(1e5, 0.999, 0.25, 1.0, 60.0, 60.0, 5e4, rules)  # too little left


def test_a_move_is_ruled_out_when_its_two_rules_never_hold_at_once():
    """A 4 h estimate for 1.6 h of work, 15 % faster: near the end the notice's share would
    pass `min_gain_share`, but by then the gain is far below `min_gain_s`."""
    rules = MoveRules()
    assert never_worth(14_400.0, 0.01, 0.87, 1.0, 60.0, 60.0, 5_599.0, rules)
    for later in (0.01, 0.5, 0.99, 0.999):
        stay, move = finish_times(14_400.0, later, later, 0.87, 1.0, 60.0, 60.0, 5_599.0)
        assert not worth_moving(stay, move, rules)


def test_a_move_worth_it_only_near_the_end_of_a_long_notice_is_not_ruled_out():
    """10 % faster, with an hour's notice and a walltime 3x the work: not worth it now (the
    gain is under 20 % of staying), but once only what the notice itself gets done is left,
    moving costs just the notice, and that is worth it."""
    rules, walltime, duration = MoveRules(), 1e5, 1e5 / 3
    stay, move = finish_times(walltime, 0.0, 0.0, 1.0, 1.1, 0.0, 3600.0, duration)
    assert not worth_moving(stay, move, rules)
    near_end = 1 - 3 * 3600.0 / walltime  # what is left is what the notice does
    stay, move = finish_times(walltime, near_end, 0.0, 1.0, 1.1, 0.0, 3600.0, duration)
    assert worth_moving(stay, move, rules)
    assert not never_worth(walltime, 0.0, 1.0, 1.1, 0.0, 3600.0, duration, rules)


def test_a_tier3_job_moves_to_the_fast_type_when_it_frees():
    sched = on_slow_type()
    sched.finished("blocker", 1000.0)
    decisions = cycle(sched, 1000.0)
    assert "x" in preempts(decisions) and preempts(decisions)["x"].grace_s == 0.0
    assert starts(decisions)["x"].allocation.gpu_type == "H100"
    x = sched.jobs["x"]
    assert x.rate == pytest.approx(1.0) and x.preemptions == 1
    assert x.progress_s == 0.0  # no checkpoint: its V100 work is lost, and worth losing
    assert x.stalled_until == 1000.0 + sched.cfg.restart_overhead_s
    assert sched.policy.next_wakeup(sched, 1000.0) == 1000.0  # the V100s go out at once


def test_a_tier3_job_that_can_save_is_asked_to_and_moves_with_all_its_work():
    """By default a job saves on notice: x gets a minute to save, keeps its V100 work (1000 s
    at 0.25) and restarts on the H100s, which were promised to it meanwhile."""
    sched = on_slow_type(config=EngineConfig())
    sched.finished("blocker", 1000.0)
    order = preempts(cycle(sched, 1000.0))["x"]
    assert order.grace_s == sched.cfg.notice_stop_s and order.checkpoint
    sched.stopped("x", 1060.0)
    assert starts(cycle(sched, 1060.0))["x"].allocation.gpu_type == "H100"
    assert sched.jobs["x"].progress_s == pytest.approx(265.0)  # 1060 s at 0.25, all kept


def test_faster_types_follow_the_type_a_job_runs_on():
    sched = on_slow_type()
    assert sched.faster_types(sched.jobs["x"]) == ["H100"]
    sched.finished("blocker", 1000.0)
    cycle(sched, 1000.0)
    assert sched.faster_types(sched.jobs["x"]) == []  # moved: nothing faster than the H100s


def test_a_moved_job_keeps_its_last_checkpoint():
    sched = on_slow_type(checkpoint_interval_s=1000.0)
    sched.finished("blocker", 2500.0)
    cycle(sched, 2500.0)
    x = sched.jobs["x"]
    assert x.allocation.gpu_type == "H100"
    assert x.progress_s == pytest.approx(500.0)  # two checkpoints of 1000 s at 0.25


def test_a_job_close_to_its_end_stays_where_it_is():
    sched = on_slow_type()
    sched.finished("blocker", 38_000.0)  # 9500 of 10000 done; moving would redo all of it
    decisions = cycle(sched, 38_000.0)
    assert "x" not in preempts(decisions)
    assert sched.jobs["x"].allocation.gpu_type == "V100"


def test_a_move_ruled_out_for_the_rest_of_a_run_is_weighed_again_after_a_restart():
    """x runs only 10 % faster on the H100s: short of `min_gain_share` for all of its run."""
    sched = sched_with(teams=QUOTA)
    sched.submit(job("blocker", tier=1, gpus=8, duration=1000.0, gpu_types=FAST_ONLY), 0.0)
    close = {"H100": 1.0, "V100": 0.9}
    sched.submit(job("x", gpus=8, duration=1e4, walltime_s=1e4, gpu_types=close), 0.0)
    cycle(sched, 0.0)
    assert "x" in sched.slower_than["H100"]
    sched.finished("blocker", 1000.0)
    cycle(sched, 1000.0)
    assert "x" not in sched.slower_than["H100"]  # not weighed again in this run
    check_all(sched, [])
    sched.submit(job("b2", tier=1, gpus=8, duration=1e5, gpu_types=FAST_ONLY), 1001.0)
    assert "b2" in starts(cycle(sched, 1001.0))
    (slow,) = node_of(sched, "x")
    sched.node_down(slow, 1002.0)  # x loses its run ...
    sched.node_up(slow, 1003.0)
    assert starts(cycle(sched, 1003.0))["x"].allocation.gpu_type == "V100"
    assert "x" in sched.slower_than["H100"]  # ... and is weighed again in its next one
    check_all(sched, [])


def test_no_move_without_moves_in_the_policy():
    sched = sched_with(ArbiterPolicy(moves=None, shortest_first=False))
    sched.submit(job("blocker", gpus=8, duration=1000.0, gpu_types=FAST_ONLY), 0.0)
    sched.submit(job("x", gpus=8, duration=1e4, walltime_s=1e4, gpu_types=FLEX), 0.0)
    cycle(sched, 0.0)
    sched.finished("blocker", 1000.0)
    assert not preempts(cycle(sched, 1000.0))


def test_tier1_jobs_never_move():
    sched = on_slow_type(tier=1)
    sched.finished("blocker", 1000.0)
    assert not preempts(cycle(sched, 1000.0))
    assert sched.jobs["x"].allocation.gpu_type == "V100"


def test_a_tier2_job_moves_only_after_notice_and_keeps_its_progress():
    sched = on_slow_type(tier=2, duration=1e5)
    sched.finished("blocker", 1000.0)
    decisions = cycle(sched, 1000.0)
    order = preempts(decisions)["x"]
    grace = sched.cfg.tier2_grace_s
    assert order.grace_s == grace and order.checkpoint and "x" not in starts(decisions)
    assert sched.policy.promised == {"x": ("H100", 8)}
    sched.stopped("x", 1000.0 + grace)
    decisions = cycle(sched, 1000.0 + grace)
    assert starts(decisions)["x"].allocation.gpu_type == "H100"
    assert sched.jobs["x"].progress_s == pytest.approx((1000.0 + grace) * 0.25)


def test_a_move_never_delays_a_reserved_start():
    sched = sched_with()
    sched.submit(job("short", gpus=4, duration=500.0, gpu_types=FAST_ONLY), 0.0)
    sched.submit(job("long", gpus=4, duration=1e5, walltime_s=1e5, gpu_types=FAST_ONLY), 0.0)
    sched.submit(job("x", gpus=4, duration=2e5, walltime_s=2e5, gpu_types=FLEX), 0.0)
    assert starts(cycle(sched, 0.0))["x"].allocation.gpu_type == "V100"
    sched.submit(job("big", gpus=8, duration=100.0, gpu_types=FAST_ONLY), 10.0)
    cycle(sched, 10.0)
    sched.finished("short", 500.0)
    decisions = cycle(sched, 500.0)  # 4 H100 free, but big holds the reservation at 1e5
    assert "x" not in preempts(decisions)
    assert sched.jobs["x"].allocation.gpu_type == "V100"


def test_without_the_reservation_the_same_move_is_made():
    sched = sched_with()
    sched.submit(job("short", gpus=4, duration=500.0, gpu_types=FAST_ONLY), 0.0)
    sched.submit(job("long", gpus=4, duration=1e5, walltime_s=1e5, gpu_types=FAST_ONLY), 0.0)
    sched.submit(job("x", gpus=4, duration=2e5, walltime_s=2e5, gpu_types=FLEX), 0.0)
    cycle(sched, 0.0)
    sched.finished("short", 500.0)
    assert starts(cycle(sched, 500.0))["x"].allocation.gpu_type == "H100"


# -- waiting for a faster type (engine.typechoice) ---------------------------------------------


def test_a_tier1_job_gets_the_first_pick_of_the_fast_type_as_it_never_moves():
    """By comparative advantage alone the tier-3 job (4x faster on the H100) would get the
    H100s and the tier-1 job (2x) the V100s; but a tier-3 job can move later and a tier-1 job
    stays where it starts."""
    sched = sched_with()
    sched.submit(job("t3", gpus=8, duration=1e4, walltime_s=1e4, gpu_types=FLEX), 0.0)
    twice = {"H100": 1.0, "V100": 0.5}
    sched.submit(job("core", tier=1, gpus=8, duration=1e5, walltime_s=1e5, gpu_types=twice), 0.0)
    started = starts(cycle(sched, 0.0))
    assert started["core"].allocation.gpu_type == "H100"
    assert started["t3"].allocation.gpu_type == "V100"


def test_a_job_waits_for_the_fast_type_when_it_frees_soon_enough_to_finish_sooner():
    sched = sched_with()
    sched.submit(job("blocker", gpus=8, duration=600.0, walltime_s=600.0, gpu_types=FAST_ONLY), 0.0)
    sched.submit(job("x", gpus=8, duration=1e4, walltime_s=1e4, gpu_types=FLEX), 0.0)
    decisions = cycle(sched, 0.0)
    assert "x" not in starts(decisions)  # 600 + 10^4 s beats 4 x 10^4 s on the V100s
    sched.finished("blocker", 600.0)
    assert starts(cycle(sched, 600.0))["x"].allocation.gpu_type == "H100"


def test_a_job_takes_the_slow_type_when_the_fast_one_is_far_beyond_its_queue_target():
    sched = sched_with()
    sched.submit(job("blocker", gpus=8, duration=1e6, walltime_s=1e6, gpu_types=FAST_ONLY), 0.0)
    sched.submit(job("x", gpus=8, duration=1e4, walltime_s=1e4, gpu_types=FLEX), 0.0)
    assert starts(cycle(sched, 0.0))["x"].allocation.gpu_type == "V100"


def test_without_patience_a_job_takes_whatever_is_free():
    sched = sched_with(ArbiterPolicy(patient=False, shortest_first=False))
    sched.submit(job("blocker", gpus=8, duration=600.0, walltime_s=600.0, gpu_types=FAST_ONLY), 0.0)
    sched.submit(job("x", gpus=8, duration=1e4, walltime_s=1e4, gpu_types=FLEX), 0.0)
    assert starts(cycle(sched, 0.0))["x"].allocation.gpu_type == "V100"


def test_a_tier1_job_preempts_tier3_on_the_fast_type_rather_than_start_slow():
    teams = [Team("a", quota={"H100": 8, "V100": 8}), Team("b", quota={"H100": 0, "V100": 0})]
    sched = sched_with(teams=teams)
    sched.submit(job("t3", team="b", gpus=8, duration=1e6, gpu_types=FAST_ONLY), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("core", tier=1, gpus=8, duration=1e4, walltime_s=1e4, gpu_types=FLEX), 5.0)
    decisions = cycle(sched, 5.0)
    assert "t3" in preempts(decisions)
    assert starts(decisions)["core"].allocation.gpu_type == "H100"


def test_a_tier1_job_borrowing_at_tier2_keeps_tier1s_queueing_target():
    """Team b is guaranteed every GPU, so team a's tier-1 job can only borrow, at tier 2 (S2).
    The H100s free in 20 minutes: within tier 2's one-hour target, beyond tier 1's five
    minutes. It is a tier-1 job all the same: it starts at once on the V100s."""
    teams = [Team("a", quota={}), Team("b", quota={"H100": 8, "V100": 8})]
    sched = sched_with(teams=teams)
    blocker = job("h", team="b", tier=2, gpus=8, duration=1200.0, walltime_s=1200.0)
    sched.submit(blocker, 0.0)
    cycle(sched, 0.0)
    sched.submit(job("core", tier=1, gpus=8, duration=1e4, walltime_s=1e4, gpu_types=FLEX), 5.0)
    started = starts(cycle(sched, 5.0))
    assert started["core"].allocation.gpu_type == "V100"
    assert sched.jobs["core"].borrows_at_tier2


THREE = {"H100": 1.0, "A100": 0.5, "V100": 0.1}  # 2x and 10x faster than on the V100s


def three_types(teams, config: EngineConfig | None = None) -> Scheduler:
    """One node each of H100, A100 and V100; team b's tier-3 job holds the A100s."""
    topo = cluster(
        *({"name": t.lower(), "nodes": 1, "gpu_type": t} for t in ("H100", "A100", "V100"))
    )
    sched = Scheduler(topo, teams, ArbiterPolicy(shortest_first=False), config)
    sched.submit(job("t3", team="b", gpus=8, duration=1e6, gpu_types={"A100": 1.0}), 0.0)
    return sched


def test_a_tier1_job_preempts_on_a_faster_type_when_the_fastest_is_beyond_its_queue_target():
    """A tier-2 job that ends in an hour holds the H100s, and noticed jobs run until killed:
    13,600 s to finish there, the best, but after a wait beyond the tier-1 queueing target, so
    not one to make. Of what is in reach now, preempting tier 3 on the A100s (20,000 s) beats
    the free V100s (100,000 s)."""
    teams = [Team("a", quota={"H100": 8, "A100": 8, "V100": 8}), Team("b", quota={})]
    sched = three_types(teams, EngineConfig(notice_stop_s=7200.0))
    blocker = job("h", team="b", tier=2, gpus=8, duration=3600.0, walltime_s=3600.0)
    sched.submit(blocker, 0.0)
    cycle(sched, 0.0)
    sched.submit(job("core", tier=1, gpus=8, duration=1e4, walltime_s=1e4, gpu_types=THREE), 5.0)
    decisions = cycle(sched, 5.0)
    assert "t3" in preempts(decisions)
    assert starts(decisions)["core"].allocation.gpu_type == "A100"


def test_free_gpus_a_tier1_job_may_not_take_are_no_reason_to_start_slow():
    """Team b owns every H100: the free H100s are not in the pool, so a tier-1 job of team a
    cannot take them (S2). They must not count as its best option, leaving it the free V100s."""
    teams = [Team("a", quota={"H100": 0, "A100": 8, "V100": 8}), Team("b", quota={"H100": 8})]
    sched = three_types(teams)
    cycle(sched, 0.0)
    sched.submit(job("core", tier=1, gpus=8, duration=1e4, walltime_s=1e4, gpu_types=THREE), 5.0)
    decisions = cycle(sched, 5.0)
    assert "t3" in preempts(decisions)
    assert starts(decisions)["core"].allocation.gpu_type == "A100"


def test_a_job_takes_the_slow_type_once_the_cycle_can_make_no_more_preemption_searches():
    """A preemption the cycle has no budget left for is no reason to leave free GPUs idle: in a
    busy queue the jobs at the head spend the budget every cycle, and the ones behind would
    otherwise wait for a preemption that never comes."""
    teams = [Team("a", quota={"H100": 8, "V100": 8}), Team("b", quota={"H100": 0, "V100": 0})]
    sched = Scheduler(
        two_types(),
        teams,
        ArbiterPolicy(shortest_first=False),
        EngineConfig(max_preemption_attempts=1),
    )
    for name in ("t3a", "t3b"):
        sched.submit(job(name, team="b", gpus=4, duration=1e6, gpu_types=FAST_ONLY), 0.0)
    cycle(sched, 0.0)
    for name in ("core1", "core2"):
        sched.submit(job(name, tier=1, gpus=4, duration=1e4, walltime_s=1e4, gpu_types=FLEX), 5.0)
    decisions = cycle(sched, 5.0)
    assert len(preempts(decisions)) == 1  # the one search the cycle may make
    assert starts(decisions)["core1"].allocation.gpu_type == "H100"
    assert starts(decisions)["core2"].allocation.gpu_type == "V100"


# Making way (S7): a job pinned to the H100s, of a team with no H100 quota, waits behind a
# flexible job of a team running within its own H100 quota, which it may not suspend (S2).
EITHER = {"H100": 1.0, "V100": 1.0}  # as fast on either type
MAKE_WAY_TEAMS = [Team("a", quota={"H100": 1}), Team("b")]


def pinned_behind_flexible(
    flexible_types=EITHER, config: EngineConfig = CANNOT_SAVE, flex_walltime: float = 1e5
) -> tuple[Scheduler, list]:
    """`f` (team a, tier 3, 1 GPU) runs on the H100 node within its team's quota; `p` (team b,
    8 GPUs, H100 only) arrives and is blocked. Returns the scheduler and p's first cycle."""
    sched = sched_with(teams=MAKE_WAY_TEAMS, config=config)
    sched.submit(
        job("f", duration=flex_walltime, walltime_s=flex_walltime, gpu_types=flexible_types),
        0.0,
    )
    assert starts(cycle(sched, 0.0))["f"].allocation.gpu_type == "H100"
    assert not sched.jobs["f"].borrowed
    sched.submit(
        job("p", team="b", gpus=8, duration=3600.0, walltime_s=3600.0, gpu_types=FAST_ONLY),
        10.0,
    )
    return sched, cycle(sched, 10.0)


def test_a_flexible_job_moves_off_the_type_a_blocked_pinned_job_needs():
    sched, decisions = pinned_behind_flexible()
    assert "p" not in starts(decisions)  # S2: team b may not suspend f, within a's quota
    assert "make way for job p" in preempts(decisions)["f"].reason
    assert starts(decisions)["f"].allocation.gpu_type == "V100"
    assert sched.policy.next_wakeup(sched, 10.0) == 10.0
    assert starts(cycle(sched, 10.0))["p"].allocation.gpu_type == "H100"


def test_a_flexible_job_that_can_save_makes_way_after_its_save():
    sched, decisions = pinned_behind_flexible(config=EngineConfig())
    order = preempts(decisions)["f"]
    assert order.grace_s == sched.cfg.notice_stop_s and order.checkpoint
    sched.stopped("f", 70.0)
    decisions = cycle(sched, 70.0)
    assert starts(decisions)["p"].allocation.gpu_type == "H100"
    assert starts(decisions)["f"].allocation.gpu_type == "V100"  # the promised type


def test_no_way_is_made_where_the_pinned_job_would_get_the_gpus_soon_anyway():
    """f ends in 300 s by its estimate: p waits that long rather than have f moved."""
    _, decisions = pinned_behind_flexible(flex_walltime=310.0)
    assert "f" not in preempts(decisions)


def test_no_way_is_made_onto_a_type_much_slower_than_the_one_left():
    """p needs both f and f2 moved; f's 28 h hold p up far longer than f2 would lose on the
    V100s (4 x 1 h), but there f2 runs at a fifth of its speed, below
    `slower_type_min_speed`: nobody moves."""
    sched = sched_with(teams=[Team("a", quota={"H100": 2}), Team("b")])
    sched.submit(job("f", duration=1e5, walltime_s=1e5, gpu_types=EITHER), 0.0)
    slow_there = {"H100": 1.0, "V100": 0.2}
    sched.submit(job("f2", duration=1e4, walltime_s=1e4, gpu_types=slow_there), 0.0)
    cycle(sched, 0.0)
    assert sched.jobs["f2"].allocation.gpu_type == "H100"
    sched.submit(
        job("p", team="b", gpus=8, duration=3600.0, walltime_s=3600.0, gpu_types=FAST_ONLY),
        10.0,
    )
    decisions = cycle(sched, 10.0)
    assert not preempts(decisions) and "p" not in starts(decisions)


def test_no_way_is_made_where_what_is_freed_cannot_start_the_pinned_job():
    """A second team-a job pinned to the H100s holds a GPU there too: moving f alone would
    leave p one GPU short, so f stays."""
    sched = sched_with(teams=[Team("a", quota={"H100": 2}), Team("b")])
    sched.submit(job("f", duration=1e5, walltime_s=1e5, gpu_types=EITHER), 0.0)
    sched.submit(job("g", duration=1e5, walltime_s=1e5, gpu_types=FAST_ONLY), 0.0)
    cycle(sched, 0.0)
    sched.submit(
        job("p", team="b", gpus=8, duration=3600.0, walltime_s=3600.0, gpu_types=FAST_ONLY),
        10.0,
    )
    decisions = cycle(sched, 10.0)
    assert not preempts(decisions) and "p" not in starts(decisions)
    assert sched.jobs["f"].allocation.gpu_type == "H100"


def test_a_look_where_every_job_that_could_make_way_is_too_few_weighs_none():
    """As above: moving f frees one GPU, p needs two more than are free. The look ends
    before any move is weighed (f is not even brought up to date)."""
    sched = sched_with(teams=[Team("a", quota={"H100": 2}), Team("b")])
    sched.submit(job("f", duration=1e5, walltime_s=1e5, gpu_types=EITHER), 0.0)
    sched.submit(job("g", duration=1e5, walltime_s=1e5, gpu_types=FAST_ONLY), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("p", team="b", gpus=8, walltime_s=3600.0, gpu_types=FAST_ONLY), 10.0)
    res = Reservation("p", "H100", 8, shadow_time=1e5, extra=0)
    free = dict(sched.index.type_free)
    assert way_for(sched, sched.jobs["p"], res, 20.0, MoveRules(), free, {}) is None
    assert sched.jobs["f"].updated_at < 20.0
    assert (
        way_for(sched, sched.jobs["p"], res, 20.0, MoveRules(), free, {}, shortcuts=False) is None
    )
    assert sched.jobs["f"].updated_at == 20.0  # the full search weighs f


def test_no_way_is_made_without_moves_in_the_policy():
    sched = sched_with(ArbiterPolicy(moves=None, shortest_first=False), MAKE_WAY_TEAMS)
    sched.submit(job("f", duration=1e5, walltime_s=1e5, gpu_types=EITHER), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("p", team="b", gpus=8, duration=3600.0, gpu_types=FAST_ONLY), 10.0)
    assert not preempts(cycle(sched, 10.0))


@settings(max_examples=40, deadline=None)
@given(
    flexible=st.lists(
        st.tuples(
            st.integers(2, 3),  # tier
            st.integers(1, 4),  # GPUs
            st.floats(1e3, 1e6),  # run time (= its estimate)
            st.sampled_from([0.2, 0.6, 1.0]),  # speed on the V100s
            st.sampled_from([1000, 500, 250]),  # its share of a GPU (under 1000: 1 GPU, shared)
        ),
        min_size=1,
        max_size=4,
    ),
    v100_busy=st.integers(0, 8),
    notice=st.sampled_from([0.0, 60.0]),
)
def test_making_way_keeps_the_invariants_and_every_job_completes(flexible, v100_busy, notice):
    """Flexible jobs of team a on the H100 node within its quota (some sharing GPUs), a
    pinned gang of team b behind them, the V100s partly busy: every cycle keeps the
    invariants, every job ends, and where jobs made way for the gang, it starts as soon as
    they have saved."""
    teams = [Team("a", quota={"H100": 8}), Team("b")]
    specs = [
        job(
            f"f{i}",
            tier=tier,
            gpus=n if milli == 1000 else 1,
            duration=d,
            walltime_s=d,
            gpu_types={"H100": 1.0, "V100": s},
            gpu_milli=milli,
        )
        for i, (tier, n, d, s, milli) in enumerate(flexible)
    ]
    if v100_busy:
        specs.append(job("busy", team="b", gpus=v100_busy, duration=2e6, gpu_types={"V100": 1.0}))
    pinned = job(
        "p",
        team="b",
        gpus=8,
        duration=3600.0,
        walltime_s=3600.0,
        submit_s=10.0,
        gpu_types=FAST_ONLY,
    )
    config = SimConfig(
        engine=EngineConfig(notice_stop_s=notice), economy=None, reliability=None, max_time_s=1e7
    )
    sim = Simulator(two_types(), teams, ArbiterPolicy(), [*specs, pinned], config)
    sched, run_cycle = sim.sched, sim.sched.cycle
    made_way: list[float] = []

    def cycle_and_check(now: float):
        result = run_cycle(now)
        check_all(sched, result.decisions)
        made_way.extend(
            now for d in result.decisions if isinstance(d, Preempt) and "make way" in d.reason
        )
        return result

    sched.cycle = cycle_and_check
    kpis = sim.run().kpis
    assert kpis["completed"] == len(specs) + 1
    p = sched.jobs["p"]
    if made_way:  # the gang starts once the jobs that made way for it have saved
        assert p.first_start <= max(made_way) + notice + 1.0  # (the next cycle: a tick on)


def _index_state(sched: Scheduler) -> tuple:
    """The capacity index as placement reads it, bucket order included."""
    index = sched.index
    return (
        list(index.free_mask),
        list(index.rack_power),
        {t: [list(b) for b in buckets] for t, buckets in index.buckets.items()},
        {k: [list(b) for b in buckets] for k, buckets in index.rack_buckets.items()},
    )


H100_NODES = 4  # nodes 0-3: racks f0 (0, 1) and f1 (2, 3), 8 GPUs in NVLink domains of 4


@settings(max_examples=80, deadline=None)
@given(
    owners=st.lists(st.integers(-1, 5), min_size=4 * H100_NODES, max_size=4 * H100_NODES),
    flexible=st.lists(
        st.tuples(st.integers(2, 3), st.floats(1e4, 1e6), st.sampled_from([0.6, 1.0])),
        min_size=6,
        max_size=6,
    ),
    gang=st.tuples(st.sampled_from([4, 8, 12, 16, 24]), st.sampled_from([1, 2, 4])),
    max_racks=st.sampled_from([None, 1]),
    v100_busy=st.integers(0, 16),
    notice=st.sampled_from([0.0, 60.0]),
)
@example(  # one mover, on a node with 4 free GPUs ahead of another in their bucket
    owners=[0, 3, -1, -1, 3, 3, -1, -1, 3, 3, 3, 3, 4, 4, 4, 4],
    flexible=[(3, 1e5, 1.0)] * 6,
    gang=(8, 1),
    max_racks=None,
    v100_busy=0,
    notice=0.0,
)
@example(  # two movers on nodes with 4 free GPUs each, the second in line the cheaper
    owners=[0, 3, -1, -1, 1, 3, -1, -1, 3, 3, 3, 3, 4, 4, 4, 4],
    flexible=[(3, 1e5, 0.6), (3, 1e5, 1.0)] + [(3, 1e5, 1.0)] * 4,
    gang=(8, 1),
    max_racks=None,
    v100_busy=0,
    notice=0.0,
)
def test_a_look_cut_short_finds_what_the_full_search_finds(
    owners, flexible, gang, max_racks, v100_busy, notice
):
    """Six jobs of team a run on GPUs drawn at random on two racks of H100s (`owners`: the
    job of each pair of GPUs, -1 for a free pair; jobs 0-2 may also run on the V100s, 3-5
    may not),
    the V100s partly busy, and team b's gang pinned to the H100s: a look with its shortcuts
    gives the same moves as the full search and leaves the capacity index the same, bucket
    order included (later placements read it)."""
    n, tp = gang
    racks = max_racks if n <= 16 else None  # (a rack holds 16)

    def build() -> Scheduler:
        c = cluster(
            {"name": "f0", "nodes": 2, "gpu_type": "H100", "nvlink_domain": 4},
            {"name": "f1", "nodes": 2, "gpu_type": "H100", "nvlink_domain": 4},
            {"name": "slow", "nodes": 2, "gpu_type": "V100"},
        )
        teams = [Team("a", quota={"H100": 32}), Team("b")]
        sched = Scheduler(c, teams, ArbiterPolicy(), EngineConfig(notice_stop_s=notice))
        for k, (tier, d, speed) in enumerate(flexible):
            slots: dict[int, list[int]] = {}
            for i, owner in enumerate(owners):
                if owner == k:
                    slots.setdefault(i // 4, []).extend((2 * i % 8, 2 * i % 8 + 1))
            if not slots:
                continue
            held = sum(len(g) for g in slots.values())
            types = {"H100": 1.0, "V100": speed} if k < 3 else FAST_ONLY
            spec = job(f"j{k}", tier=tier, gpus=held, duration=d, walltime_s=d, gpu_types=types)
            sched.submit(spec, 0.0)
            alloc = Allocation("H100", tuple((node, tuple(g)) for node, g in slots.items()))
            sched.adopt(sched.jobs[spec.id], alloc, 0.0)
        if v100_busy:
            busy = job("busy", team="b", gpus=v100_busy, duration=2e6, gpu_types={"V100": 1.0})
            sched.submit(busy, 0.0)
            cycle(sched, 0.0)
        p = job("p", team="b", gpus=n, tp_size=tp, max_racks=racks, gpu_types=FAST_ONLY)
        sched.submit(p, 10.0)
        return sched

    looks = []
    for shortcuts in (True, False):
        sched = build()
        res = Reservation("p", "H100", n, shadow_time=1e6, extra=0)
        free = dict(sched.index.type_free)
        way = way_for(sched, sched.jobs["p"], res, 20.0, MoveRules(), free, {}, shortcuts=shortcuts)
        moves = None if way is None else [(m.job.id, m.gpu_type, m.grace_s, a) for m, a, _ in way]
        looks.append((moves, _index_state(sched)))
    assert looks[0] == looks[1]
