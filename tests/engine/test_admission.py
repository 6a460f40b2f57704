"""Admission (S2, E1, E4): the tier a job really runs at and the quota book."""

from gpu_arbiter.domain import MILLI, Team, Tier
from gpu_arbiter.engine import Scheduler
from gpu_arbiter.engine.admission import QuotaBook, admitted_tier
from gpu_arbiter.engine.config import EngineConfig
from tests.conftest import job
from tests.engine.helpers import cluster, cycle, preempts

CFG = EngineConfig()


def test_the_roi_gate_demotes_a_large_long_job_without_justification_to_tier3():
    spec = job("big", tier=1, gpus=256, duration=25 * 3600.0)
    assert admitted_tier(spec, CFG) == Tier.EXPLORATORY


def test_a_justified_large_long_job_keeps_its_tier():
    spec = job("big", tier=1, gpus=256, duration=25 * 3600.0, justification="flagship model")
    assert admitted_tier(spec, CFG) == Tier.CORE


def test_the_roi_gate_needs_both_many_gpus_and_a_long_run():
    assert admitted_tier(job("wide", tier=2, gpus=256, duration=3600.0), CFG) == Tier.BUSINESS
    assert admitted_tier(job("long", tier=2, gpus=128, duration=1e6), CFG) == Tier.BUSINESS


def test_the_roi_gate_trusts_the_walltime_estimate_over_the_real_duration():
    spec = job("big", tier=2, gpus=256, duration=3600.0, walltime_s=30 * 3600.0)
    assert admitted_tier(spec, CFG) == Tier.EXPLORATORY


def test_a_spent_budget_lowers_the_tier_but_never_raises_it():
    assert admitted_tier(job("x", tier=1), CFG, lambda team, tier: Tier.EXPLORATORY) == 3
    assert admitted_tier(job("x", tier=3), CFG, lambda team, tier: Tier.CORE) == 3


def test_the_pool_is_what_no_team_is_guaranteed():
    book = QuotaBook({"a": Team("a", quota={"H100": 40})}, {"H100": 64, "A100": 8})
    assert book.pool == {"H100": 24 * MILLI, "A100": 8 * MILLI}


def test_a_job_is_within_quota_when_the_teams_work_of_its_tier_and_above_fits():
    book = QuotaBook({"a": Team("a", quota={"H100": 8})}, {"H100": 64})
    book.add("a", "H100", 3, 8 * MILLI)  # tier-3 work does not count against a tier-2 job
    assert book.within("a", "H100", 8 * MILLI, tier=2)
    assert not book.within("a", "H100", 1 * MILLI, tier=3)


def test_fractional_jobs_use_their_share_of_the_quota():
    book = QuotaBook({"a": Team("a", quota={"T4": 1})}, {"T4": 4})
    book.add("a", "T4", 2, 250)
    book.add("a", "T4", 2, 500)
    assert book.within("a", "T4", 250, tier=2)  # 0.25 + 0.5 + 0.25 GPU: the whole guarantee
    assert not book.within("a", "T4", 251, tier=2)
    # Tier 1 counts only tier-1 work: the guarantee of 1 and the pool of 3.
    assert book.tier1_fits("a", "T4", 4 * MILLI)
    assert not book.tier1_fits("a", "T4", 4 * MILLI + 1)


def test_tier1_beyond_its_quota_may_use_only_what_is_left_of_the_pool():
    teams = {"a": Team("a", quota={"H100": 8}), "b": Team("b", quota={"H100": 8})}
    book = QuotaBook(teams, {"H100": 20})  # pool of 4
    assert book.tier1_fits("a", "H100", 12 * MILLI)
    assert not book.tier1_fits("a", "H100", 13 * MILLI)
    book.tier1_excess[("b", "H100")] = 3 * MILLI  # b's tier-1 jobs already use 3 of the pool
    assert not book.tier1_fits("a", "H100", 10 * MILLI)
    assert book.tier1_fits("a", "H100", 9 * MILLI)


def test_the_most_tier1_can_hold_is_the_guarantee_and_the_whole_pool():
    teams = {"a": Team("a", quota={"H100": 8}), "b": Team("b", quota={"H100": 8})}
    book = QuotaBook(teams, {"H100": 20})
    book.tier1_excess[("b", "H100")] = 3 * MILLI  # in use now, but it may free up
    assert book.tier1_most("a", "H100") == 12 * MILLI
    assert book.tier1_most("c", "H100") == 4 * MILLI  # no guarantee: the pool only


def test_a_running_job_demoted_for_a_spent_budget_becomes_a_victim_of_its_new_tier():
    """A tier-1 job is never a victim (S1); once its team's budget ran out mid-run the driver
    demotes it (E1) and another team's tier-1 job may stop it."""
    sched = Scheduler(cluster({"name": "r0", "nodes": 1}), [Team("a"), Team("b")])
    sched.submit(job("old", team="a", tier=1, gpus=8, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("new", team="b", tier=1, gpus=8, duration=1e5), 5.0)
    assert preempts(cycle(sched, 5.0)) == {}
    assert sched.demote("old", Tier.EXPLORATORY, 10.0)
    assert not sched.demote("old", Tier.BUSINESS, 10.0)  # never raised again
    assert list(preempts(cycle(sched, 11.0))) == ["old"]
    assert sched.jobs["old"].tier == Tier.EXPLORATORY
