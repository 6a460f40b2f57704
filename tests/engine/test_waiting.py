"""Why a pending job waits, as the engine records it (`engine.waiting`) after real cycles."""

from __future__ import annotations

from gpu_arbiter.domain import Team, Tier
from gpu_arbiter.engine import Scheduler
from gpu_arbiter.engine.waiting import usable
from tests.conftest import job
from tests.engine.helpers import cluster, cycle, starts


def racks(*nodes: int, cap_kw: float = 40.0):
    """One rack per entry, of that many 8-GPU H100 nodes."""
    return cluster(
        *({"name": f"r{i}", "nodes": n, "power_cap_kw": cap_kw} for i, n in enumerate(nodes))
    )


def run(sched: Scheduler, *specs, now: float = 0.0) -> None:
    for spec in specs:
        sched.submit(spec, now)
    cycle(sched, now)


def test_too_few_free_gpus_of_any_accepted_type_is_capacity():
    sched = Scheduler(racks(1), (), "backfill")
    run(sched, job("fill", gpus=6, duration=1e5, walltime_s=1e5))
    run(sched, job("j", gpus=4), now=1.0)
    why = sched.why_pending("j")
    assert why.code == "capacity" and "needs 4 H100, 2 free" in why.text


def test_enough_free_in_total_but_no_node_with_all_of_them_is_gang():
    sched = Scheduler(racks(2), (), "backfill")
    run(sched, *(job(f"f{i}", gpus=5, duration=1e5, walltime_s=1e5) for i in range(2)))
    run(sched, job("j", gpus=6), now=1.0)
    why = sched.why_pending("j")
    assert why.code == "gang" and "at most 3 free on one" in why.text


def test_a_gang_capped_to_one_rack_is_topology_when_no_rack_holds_it():
    sched = Scheduler(racks(2, 2), (), "backfill")
    sched.drain("r0-n00")
    sched.drain("r1-n00")  # 8 GPUs in service in each rack
    run(sched, job("j", gpus=12, max_racks=1))
    why = sched.why_pending("j")
    assert why.code == "topology" and "the 1 emptiest racks have 8 free" in why.text


def test_tp_groups_are_counted_whole_inside_each_nvlink_domain():
    assert usable(0b0011_0011, 8, 4, 4) == 0 and usable(0b0011_0011, 8, 4, 2) == 4
    assert usable(0b1111_0011, 8, 4, 4) == 4 and usable(0xFF, 8, 8, 3) == 6


def test_free_gpus_in_racks_without_power_headroom_are_power():
    probe = Scheduler(racks(1), (), "backfill")
    watts = probe.index.watts_per_gpu("H100", "normal")
    cap_kw = (1000.0 + 3.5 * watts) / 1000  # the node idles at 1 kW: room for 3 busy GPUs
    sched = Scheduler(racks(1, cap_kw=cap_kw), (), "backfill")
    run(sched, job("j", gpus=4))
    why = sched.why_pending("j")
    assert why.code == "power" and "racks (r0) lack the power headroom" in why.text


def test_a_job_that_would_delay_a_reservation_is_kept_off_the_gpus_it_fits_on():
    sched = Scheduler(racks(1), (), "backfill")
    run(sched, job("a", gpus=4, duration=100.0, walltime_s=100.0))
    run(sched, job("big", gpus=8, walltime_s=100.0), job("long", gpus=4, walltime_s=1e4), now=1.0)
    assert sched.why_pending("big").code == "capacity"
    why = sched.why_pending("long")
    assert why.code == "reserved" and "kept for big" in why.text


def test_tier1_beyond_quota_and_pool_is_quota():
    # Team a's guarantee is 8 GPUs of 24, so the pool is 16; a's tier-1 job holds 12 of it.
    teams = [Team("a", quota={"H100": 8}), Team("b")]
    sched = Scheduler(racks(3), teams)
    run(
        sched,
        job("j1", team="a", tier=1, gpus=20, duration=1e5),
        job("j2", team="b", tier=1, gpus=8),
    )
    why = sched.why_pending("j2")
    assert why.code == "quota" and "team b's quota plus the unowned pool" in why.text


def test_a_team_out_of_credits_waits_for_its_budget_and_says_what_else_blocks():
    sched = Scheduler(racks(2), (), "backfill", budget=lambda team, tier: Tier(3))
    run(sched, *(job(f"f{i}", gpus=5, duration=1e5, walltime_s=1e5) for i in range(2)))
    run(sched, job("j", tier=1, gpus=6), job("k", tier=3, gpus=6), now=1.0)
    why = sched.why_pending("j")
    assert why.code == "budget" and "split across nodes" in why.text
    # A job that asked for tier 3 anyway is not held back by the budget.
    assert sched.why_pending("k").code == "gang"


def test_a_job_holding_gpus_for_tier2_victims_is_preempting():
    sched = Scheduler(racks(1), [Team("a", quota={"H100": 4}), Team("b")])
    run(sched, job("biz", team="b", tier=2, gpus=8, duration=1e5))
    run(sched, job("core", team="a", tier=1, gpus=4), now=10.0)
    assert "core" in sched.holds
    why = sched.why_pending("core")
    assert why.code == "preempting" and "1 tier-2 job(s)" in why.text


def test_failed_and_cordoned_nodes_offer_nothing():
    sched = Scheduler(racks(2), (), "backfill")
    sched.node_down("r0-n00", 0.0)
    sched.drain("r0-n01")
    run(sched, job("j", gpus=1))
    assert sched.why_pending("j").text == "no GPU of an accepted type is in service"


def test_a_job_no_cycle_looked_at_yet_is_queued_and_a_started_one_has_no_reason():
    sched = Scheduler(racks(1), (), "backfill")
    sched.submit(job("j", gpus=1), 0.0)
    assert sched.why_pending("j").code == "queued"
    assert "j" in starts(cycle(sched, 0.0))
    assert sched.why_pending("j") is None and sched.waiting_reasons() == {}


def test_the_reason_stands_while_the_job_is_set_aside_and_goes_when_it_starts():
    sched = Scheduler(racks(1), (), "backfill")
    run(sched, job("fill", gpus=8, duration=100.0, walltime_s=100.0))
    run(sched, job("j", gpus=8), now=1.0)
    cycle(sched, 2.0)
    assert sched.set_aside("j") is not None and sched.why_pending("j").code == "capacity"
    sched.finished("fill", 100.0)
    assert "j" in starts(cycle(sched, 100.0))
    assert sched.why_pending("j") is None


def test_reasons_cover_every_queued_job():
    sched = Scheduler(racks(1), (), "backfill")
    run(sched, job("fill", gpus=6, duration=1e5, walltime_s=1e5))
    run(sched, job("j1", gpus=4), job("j2", gpus=8), now=1.0)
    assert {k: r.code for k, r in sched.waiting_reasons().items()} == {
        "j1": "capacity",
        "j2": "capacity",
    }
