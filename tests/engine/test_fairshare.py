"""Fair share (S4): teams of one tier take turns by weighted dominant share."""

import pytest

from gpu_arbiter.domain import MILLI, Team
from gpu_arbiter.domain.presets import small
from gpu_arbiter.engine import Scheduler
from gpu_arbiter.engine.fairshare import FairShare
from tests.conftest import job
from tests.engine.helpers import cycle, starts


def test_two_equal_teams_with_equal_demand_get_equal_shares():
    sched = Scheduler(small(), [Team("a"), Team("b")])
    for i in range(20):  # a's jobs all arrive first
        sched.submit(job(f"a{i}", team="a", gpus=4, duration=1e5), 0.0)
    for i in range(20):
        sched.submit(job(f"b{i}", team="b", gpus=4, duration=1e5), 0.0)
    started = starts(cycle(sched, 0.0))
    assert len(started) == 16
    assert sum(j.startswith("a") for j in started) == 8


def test_weighted_shares_follow_the_business_weight():
    sched = Scheduler(small(), [Team("a", weight=3.0), Team("b", weight=1.0)])
    for team in "ab":
        for i in range(20):
            sched.submit(job(f"{team}{i}", team=team, gpus=4, duration=1e5), 0.0)
    started = starts(cycle(sched, 0.0))
    assert sum(j.startswith("a") for j in started) == 12


def test_a_higher_tier_goes_first_whatever_the_shares():
    sched = Scheduler(small(), [Team("a", weight=10.0), Team("b")])
    for i in range(16):
        sched.submit(job(f"a{i}", team="a", gpus=8, duration=1e5), 0.0)
    sched.submit(job("b-biz", team="b", tier=2, gpus=8), 0.0)
    assert "b-biz" in starts(cycle(sched, 0.0))


def test_past_usage_is_forgotten_with_the_half_life():
    fair = FairShare({"H100": 100}, {"a": 1.0}, half_life_s=3600.0)
    fair.add("a", "H100", 50 * MILLI)
    fair.decay_to(3600.0)
    assert fair.recent["a"]["H100"] == pytest.approx(25.0)
    fair.add("a", "H100", -50 * MILLI)
    assert fair.share("a") == pytest.approx(0.5 * 25.0 / 100)
    fair.decay_to(7200.0)
    assert fair.share("a") == pytest.approx(0.5 * 12.5 / 100)


def test_the_dominant_type_sets_the_share():
    fair = FairShare({"H100": 100, "A100": 10}, {"a": 2.0}, half_life_s=3600.0)
    fair.add("a", "H100", 10 * MILLI)
    fair.add("a", "A100", 5 * MILLI)
    assert fair.share("a") == pytest.approx(0.5 * 5 / 10 / 2.0)


def test_a_share_read_before_a_change_is_read_again_after_it():
    """Shares are remembered between changes (a walk reads them once per job)."""
    fair = FairShare({"H100": 100}, {"a": 1.0, "b": 1.0}, half_life_s=3600.0)
    assert fair.share("a") == 0.0 and fair.share("b") == 0.0
    fair.add("a", "H100", 40 * MILLI)
    assert fair.share("a") == pytest.approx(0.5 * 40 / 100)
    assert fair.share("b") == 0.0


def test_a_fractional_job_counts_its_share_of_a_gpu():
    fair = FairShare({"T4": 4}, {"a": 1.0, "b": 1.0}, half_life_s=3600.0)
    fair.add("a", "T4", 250)  # a quarter-GPU pod (S11)
    fair.add("b", "T4", 1 * MILLI)
    assert fair.share("a") == pytest.approx(0.5 * 0.25 / 4)
    assert fair.share("a") < fair.share("b")
