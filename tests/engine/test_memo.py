"""Failed searches are remembered only while nothing they looked at has changed."""

from __future__ import annotations

from gpu_arbiter.domain.presets import small
from gpu_arbiter.engine import Scheduler
from gpu_arbiter.engine.memo import FailureMemo
from tests.conftest import job


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
    assert "next" in sched._blocked
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
