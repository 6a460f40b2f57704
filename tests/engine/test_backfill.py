"""EASY backfill (S6): a later job starts now only if it cannot delay the reserved start."""

from gpu_arbiter.engine import Scheduler
from gpu_arbiter.engine.backfill import Reservation, fits_before
from tests.conftest import job
from tests.engine.helpers import cluster, cycle, starts


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
