"""EASY backfill (S6): a later job starts now only if it cannot delay the reserved start; a
gang that needs one node holds one node."""

from gpu_arbiter.domain import Allocation, Team, Tier
from gpu_arbiter.engine import Scheduler
from gpu_arbiter.engine.backfill import Reservation, fits_before, node_free_at
from tests.conftest import job
from tests.engine.helpers import cluster, cycle, node_of, preempts, starts


def busy_node():
    """One 8-GPU node: a 6-GPU job runs until t=1000 by its walltime, then an 8-GPU job waits."""
    sched = Scheduler(cluster({"name": "r0", "nodes": 1}), policy="backfill")
    sched.submit(job("long", gpus=6, duration=1000.0, walltime_s=1000.0), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("wide", gpus=8, duration=100.0, walltime_s=100.0), 1.0)
    return sched


def test_a_small_job_that_ends_before_the_shadow_time_backfills():
    sched = busy_node()
    sched.submit(job("quick", gpus=2, duration=500.0, walltime_s=500.0), 2.0)
    assert set(starts(cycle(sched, 2.0))) == {"quick"}


def test_a_small_job_that_would_end_after_the_shadow_time_waits():
    sched = busy_node()
    sched.submit(job("slow", gpus=2, duration=5000.0, walltime_s=5000.0), 2.0)
    assert starts(cycle(sched, 2.0)) == {}


def test_a_job_without_a_walltime_never_backfills_past_a_reservation():
    sched = busy_node()
    sched.submit(job("unknown", gpus=1, duration=1.0), 2.0)
    assert starts(cycle(sched, 2.0)) == {}


def test_a_late_job_may_use_the_extra_gpus_the_reservation_leaves_free():
    res = Reservation("wide", "H100", gpus=8, shadow_time=1000.0, extra=2)
    assert fits_before(res, 2, est_runtime_s=5000.0, now=0.0)
    assert res.extra == 0
    assert not fits_before(res, 1, est_runtime_s=5000.0, now=0.0)
    assert fits_before(res, 1, est_runtime_s=900.0, now=0.0)


def test_the_reserved_job_starts_when_the_running_job_ends():
    sched = busy_node()
    sched.finished("long", 1000.0)
    assert set(starts(cycle(sched, 1000.0))) == {"wide"}


def test_a_higher_tier_newcomer_is_not_held_back_by_a_lower_tier_reservation():
    # "wide" (tier 3) holds the reservation; a tier-2 job arriving later would have been walked
    # before it, so it may start now even though it ends after the shadow time.
    sched = Scheduler(cluster({"name": "r0", "nodes": 1}), policy="backfill")
    sched.submit(job("long", tier=2, gpus=6, duration=1000.0, walltime_s=1000.0), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("wide", tier=3, gpus=8, duration=100.0, walltime_s=100.0), 1.0)
    cycle(sched, 1.0)
    cycle(sched, 1.5)  # the full walk gives "wide" its reservation
    sched.submit(job("urgent", tier=2, gpus=2, duration=5000.0, walltime_s=5000.0), 2.0)
    assert set(starts(cycle(sched, 2.0))) == {"urgent"}


def scattered(policy: str) -> Scheduler:
    """Two 8-GPU nodes, each with 6 GPUs busy for a long time: 4 GPUs are free by count, but a
    tp-4 job needs them on one node, so it is blocked; a small long job arrives behind it."""
    sched = Scheduler(cluster({"name": "r0", "nodes": 2, "power_cap_kw": 80.0}), policy=policy)
    for name in ("left", "right"):
        sched.submit(job(name, tier=1, gpus=6, duration=1e6, walltime_s=1e6, tp_size=2), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("wide", tier=2, gpus=4, duration=100.0, walltime_s=100.0, tp_size=4), 1.0)
    sched.submit(job("small", tier=3, gpus=1, duration=1e5, walltime_s=1e5), 2.0)
    return sched


def test_easy_holds_free_gpus_for_a_job_that_cannot_be_placed_on_them():
    assert starts(cycle(scattered("backfill"), 2.0)) == {}


def test_arbiter_does_not_hold_scattered_gpus_that_would_not_start_the_blocked_job():
    assert set(starts(cycle(scattered("arbiter"), 2.0))) == {"small"}


def draining() -> Scheduler:
    """Two 8-GPU nodes: on r0-n00 a 6-GPU job ends at t=1000 by its walltime, on r0-n01 a 4-GPU
    job runs for days. wide (tier 2) needs 8 GPUs of one node: r0-n00 is the node to wait for."""
    sched = Scheduler(cluster({"name": "r0", "nodes": 2, "power_cap_kw": 80.0}))
    sched.submit(job("short", tier=1, gpus=6, duration=1000.0, walltime_s=1000.0), 0.0)
    sched.submit(job("long", tier=1, gpus=4, duration=1e6, walltime_s=1e6), 0.0)
    cycle(sched, 0.0)
    assert node_of(sched, "short") == ["r0-n00"] and node_of(sched, "long") == ["r0-n01"]
    sched.submit(job("wide", tier=2, gpus=8, duration=100.0, walltime_s=100.0), 1.0)
    assert starts(cycle(sched, 1.0)) == {}
    return sched


def started_on(sched: Scheduler, now: float, name: str, **spec) -> list[str]:
    """Submit a job running for days at `now`; the nodes it starts on in that cycle."""
    sched.submit(job(name, duration=1e5, walltime_s=1e5, **spec), now)
    assert set(starts(cycle(sched, now))) == {name}
    return node_of(sched, name)


def test_a_gang_that_needs_one_node_reserves_the_node_that_frees_first():
    sched = draining()
    res = sched.reservations["H100"]
    assert (res.job_id, res.node, res.shadow_time, res.extra) == ("wide", 0, 1000.0, 0)


def test_a_long_job_starts_on_another_node_than_the_one_a_gang_waits_for():
    """By count, 12 GPUs free at t=1000 leave 4 to spare and the best fit is r0-n00's 2 free
    GPUs: the gang would then wait for explore's 28 h. Its node held, explore goes elsewhere."""
    sched = draining()
    assert started_on(sched, 2.0, "explore", tier=3, gpus=1) == ["r0-n01"]
    sched.finished("short", 1000.0)
    assert set(starts(cycle(sched, 1000.0))) == {"wide"}


def test_a_lower_tier_job_that_only_fits_on_the_held_node_waits():
    sched = draining()
    assert started_on(sched, 2.0, "fill", tier=3, gpus=4) == ["r0-n01"]
    sched.submit(job("more", tier=3, gpus=2, duration=1e5, walltime_s=1e5), 3.0)
    sched.submit(job("quick", tier=3, gpus=2, duration=500.0, walltime_s=500.0), 3.0)
    assert set(starts(cycle(sched, 3.0))) == {"quick"}  # it ends before the gang's start
    assert node_of(sched, "quick") == ["r0-n00"]


def test_a_higher_tier_job_keeps_off_the_held_node_where_another_has_room():
    sched = draining()
    assert started_on(sched, 2.0, "core", tier=1, gpus=1) == ["r0-n01"]


def test_a_higher_tier_job_takes_the_held_node_when_no_other_has_room():
    sched = draining()
    assert started_on(sched, 2.0, "core", tier=1, gpus=3) == ["r0-n01"]
    assert started_on(sched, 3.0, "core2", tier=1, gpus=2) == ["r0-n00"]


def test_node_free_at_finds_the_first_node_with_room_by_expected_ends():
    a = Allocation("H100", ((0, (0, 1)),))
    b = Allocation("H100", ((1, (0, 1, 2)),))
    c = Allocation("H100", ((0, (2,)), (2, (0, 1, 2, 3))))
    free = {0: 2, 1: 3, 2: -1}.__getitem__  # node 2 can never hold the job
    ends = [(50.0, a), (80.0, c), (100.0, b)]
    assert node_free_at(6, free, ends, now=0.0) == (1, 100.0, 0)
    assert node_free_at(5, free, ends, now=0.0) == (0, 80.0, 0)
    assert node_free_at(4, free, ends, now=60.0) == (0, 60.0, 0)
    assert node_free_at(9, free, ends, now=0.0) is None


def test_a_node_reservation_counts_only_allocations_on_its_node():
    res = Reservation("wide", "H100", gpus=8, shadow_time=1000.0, extra=0, node=0)
    assert res.covers(Allocation("H100", ((0, (3,)),)))
    assert not res.covers(Allocation("H100", ((1, (3,)),)))
    assert Reservation("w", "H100", 8, 1000.0, 0).covers(Allocation("H100", ((1, (3,)),)))


def test_a_later_job_does_not_stop_jobs_on_the_node_a_gang_waits_for():
    """Stopping jobs is no way round a reservation: quick runs on r0-n00, the node wide waits
    for."""
    sched = draining()
    assert started_on(sched, 2.0, "core", tier=1, gpus=4) == ["r0-n01"]
    sched.submit(job("quick", tier=3, gpus=2, duration=500.0, walltime_s=500.0), 3.0)
    assert set(starts(cycle(sched, 3.0))) == {"quick"}  # it ends before wide's start
    assert node_of(sched, "quick") == ["r0-n00"]
    pushy_stops_nobody_and_wide_starts_on_time(sched, gpus=2, now=4.0)


def pushy_stops_nobody_and_wide_starts_on_time(sched: Scheduler, gpus: int, now: float) -> None:
    """pushy (tier 2, long) could start only by stopping quick, whose GPUs wide has reserved:
    it stops nobody, and wide starts when short and quick have ended."""
    sched.submit(job("pushy", tier=2, gpus=gpus, duration=1e5, walltime_s=1e5), now)
    decisions = cycle(sched, now)
    assert preempts(decisions) == {} and starts(decisions) == {}
    sched.finished("quick", 500.0)
    sched.finished("short", 1000.0)
    assert set(starts(cycle(sched, 1000.0))) == {"wide"}


def three_nodes(wide_tier: int = 2) -> Scheduler:
    """Three 8-GPU nodes: short (tier 1) holds r0-n00 until t=1000, long (tier 1) r0-n01 for
    days, quick (tier 3) half of r0-n02 until t=500; wide needs 16 GPUs, more than a node, so
    it holds a count of GPUs from t=1000 on, with none to spare."""
    sched = Scheduler(cluster({"name": "r0", "nodes": 3, "power_cap_kw": 120.0}))
    sched.submit(job("short", tier=1, gpus=8, duration=1000.0, walltime_s=1000.0), 0.0)
    sched.submit(job("long", tier=1, gpus=8, duration=1e6, walltime_s=1e6), 0.0)
    sched.submit(job("quick", tier=3, gpus=4, duration=500.0, walltime_s=500.0), 0.0)
    assert set(starts(cycle(sched, 0.0))) == {"short", "long", "quick"}
    sched.submit(job("wide", tier=wide_tier, gpus=16, duration=100.0, walltime_s=100.0), 1.0)
    assert starts(cycle(sched, 1.0)) == {}
    res = sched.reservations["H100"]
    assert (res.job_id, res.node, res.shadow_time, res.extra) == ("wide", None, 1000.0, 0)
    return sched


def test_a_later_job_that_would_delay_a_count_reservation_stops_nobody():
    pushy_stops_nobody_and_wide_starts_on_time(three_nodes(), gpus=8, now=2.0)


def test_a_later_job_that_ends_before_the_reserved_start_may_still_stop_jobs():
    sched = three_nodes()
    sched.submit(job("brief", tier=2, gpus=8, duration=300.0, walltime_s=300.0), 2.0)
    assert set(preempts(cycle(sched, 2.0))) == {"quick"}


def test_a_tier_1_job_still_stops_tier_3_at_once_past_another_tier_1_reservation():
    """S1: a tier-1 job suspends tier-3 jobs within a cycle; a reservation does not stop it."""
    sched = three_nodes(wide_tier=1)
    sched.submit(job("core", tier=1, gpus=8, duration=1e5, walltime_s=1e5), 2.0)
    decisions = cycle(sched, 2.0)
    assert set(preempts(decisions)) == {"quick"} and set(starts(decisions)) == {"core"}


def test_a_tier_1_job_borrowing_at_tier_2_still_stops_tier_3_past_a_reservation():
    """Tier 1 beyond its guarantee and the pool runs at tier 2 but keeps tier 1's precedence
    over lower tiers: it stops a tier-3 borrower on GPUs another tier-1 job has reserved."""
    teams = [Team("a", quota={"H100": 8}), Team("b", quota={"H100": 8}), Team("c")]  # pool 8
    sched = Scheduler(cluster({"name": "r0", "nodes": 3, "power_cap_kw": 120.0}), teams)
    sched.submit(job("short", team="b", tier=1, gpus=8, duration=1e3, walltime_s=1e3), 0.0)
    sched.submit(job("long", team="c", tier=1, gpus=8, duration=1e6, walltime_s=1e6), 0.0)
    sched.submit(job("quick", team="c", tier=3, gpus=4, duration=500.0, walltime_s=500.0), 0.0)
    assert set(starts(cycle(sched, 0.0))) == {"short", "long", "quick"}  # long fills the pool
    sched.submit(job("wide", team="a", tier=1, gpus=16, duration=100.0, walltime_s=100.0), 1.0)
    assert starts(cycle(sched, 1.0)) == {}
    assert sched.reservations["H100"].job_id == "wide"
    sched.submit(job("core", team="c", tier=1, gpus=8, duration=1e5, walltime_s=1e5), 2.0)
    order = preempts(cycle(sched, 2.0))
    assert set(order) == {"quick"} and order["quick"].for_job == "core"
    sched.stopped("quick", 62.0)
    assert "core" in starts(cycle(sched, 62.0))
    assert sched.jobs["core"].tier == Tier.BUSINESS and sched.jobs["core"].borrows_at_tier2
