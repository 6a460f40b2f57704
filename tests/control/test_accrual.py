"""Live cost (E1, E5): running jobs are charged as they run, once per second held, across
restarts; a team that spends its budget mid-run has its running jobs capped at the tier an
exhausted budget allows."""

from __future__ import annotations

import math

import pytest

from gpu_arbiter.control.store import open_database
from tests.control.direct import (
    ADMIN,
    Executor,
    advance,
    call,
    charges,
    new_loop,
    row,
    setup,
    submit,
    tick,
)


@pytest.fixture
def db(tmp_path):
    engine = open_database(str(tmp_path / "a.db"))
    yield engine
    engine.dispose()


def test_a_running_job_is_charged_as_it_runs_and_a_restart_charges_no_second_twice(db, tmp_path):
    executor = Executor()
    loop = new_loop(db, tmp_path, executor)
    advance(loop, 86_400)
    setup(loop, {"a": None}, quota=8)
    job = submit(loop, "a", gpus=4, tier=1)
    tick(loop)
    started = row(loop, job)["started_at"]
    assert job in executor.jobs and started == loop._last_now

    advance(loop, 119)
    tick(loop)  # 120 s after the start
    first = charges(loop, job)
    assert [(e.start, e.end, e.gpu_seconds) for e in first] == [(started, started + 120, 480)]
    assert loop.accounts.spent["a"] == pytest.approx(3.5 * 4 * 120 / 3600)

    advance(loop, 29)
    tick(loop)  # less than a minute since the last charge: nothing yet
    assert len(charges(loop, job)) == 1
    advance(loop, 39)
    tick(loop)
    assert charges(loop, job)[-1].end == started + 190

    # A restart reads what was charged from the ledger: the end charges only the rest.
    loop2 = new_loop(db, tmp_path, executor)
    assert loop2.state.sched is not None and job in loop2.state.sched.running
    loop2._last_now = started + 200
    call(loop2, loop2.commands.cancel, ADMIN, job)
    pieces = charges(loop2, job)
    assert [(e.start, e.end) for e in pieces] == [
        (started, started + 120),
        (started + 120, started + 190),
        (started + 190, started + 200),
    ]
    assert math.fsum(e.gpu_seconds for e in pieces) == pytest.approx(4 * 200)
    assert all(e.reason == "run" for e in pieces)
    loop2.accounts.ledger.check_balanced()
    assert loop2.accounts.spent["a"] == pytest.approx(3.5 * 4 * 200 / 3600)


def test_a_team_that_spends_its_budget_mid_run_runs_on_at_the_exhausted_tier(db, tmp_path):
    executor = Executor()
    loop = new_loop(db, tmp_path, executor)
    advance(loop, 86_400)
    # 10 credits: 8 borrowed H100s at tier 1 (1.6 credits/GPU-h) spend them in 2812 s.
    setup(loop, {"a": 10.0, "b": None})
    job = submit(loop, "a", gpus=8, tier=1)
    tick(loop)
    assert job in executor.jobs
    assert loop.accounts.budgets.can_spend("a", loop._last_now)

    advance(loop, 1800)
    tick(loop)
    assert loop.accounts.budgets.can_spend("a", loop._last_now) and row(loop, job)["tier"] == 1
    advance(loop, 1800)
    tick(loop)
    assert not loop.accounts.budgets.can_spend("a", loop._last_now)
    assert loop.state.sched is not None and int(loop.state.sched.jobs[job].tier) == 3
    now = row(loop, job)
    assert now["state"] == "running" and now["tier"] == 3 and "budget" in now["reason"]
    demoted_at = loop._last_now
    # From now on it is billed at the exhausted tier's (preemptible) price.
    advance(loop, 60)
    tick(loop)
    last = charges(loop, job)[-1]
    assert (int(last.tier), last.preemptible, last.start) == (3, True, demoted_at)

    # ... and it is a tier-3 victim: another team's tier-1 job takes its GPUs.
    other = submit(loop, "b", gpus=8, tier=1)
    tick(loop)  # the victim is told to stop ...
    tick(loop)  # ... and once it has, the tier-1 job starts
    assert job not in executor.jobs and other in executor.jobs
    assert row(loop, job)["state"] == "pending"
    loop.accounts.ledger.check_balanced()


def test_each_running_job_is_charged_a_minute_after_its_last_charge_not_all_at_once(db, tmp_path):
    """Jobs started at different times fall due at different times, so the charges of many
    running jobs spread over the minute instead of landing in one tick."""
    executor = Executor()
    loop = new_loop(db, tmp_path, executor)
    advance(loop, 86_400)
    setup(loop, {"a": None}, quota=8)
    first = submit(loop, "a", gpus=4, tier=1)
    tick(loop)
    advance(loop, 29)
    second = submit(loop, "a", gpus=4, tier=1)
    tick(loop)  # 30 s after the first start
    assert {first, second} <= set(executor.jobs)
    advance(loop, 30)
    tick(loop)  # the first job's minute is up, the second's not yet
    assert (len(charges(loop, first)), len(charges(loop, second))) == (1, 0)
    advance(loop, 29)
    tick(loop)
    assert (len(charges(loop, first)), len(charges(loop, second))) == (1, 1)


def test_work_lost_to_a_node_failure_counts_whole_though_part_of_it_was_charged_as_it_ran(
    db, tmp_path
):
    """A checkpointing job loses everything since its last checkpoint: the seconds charged
    while it ran are given back (the cluster absorbs lost work) and count as lost GPU-hours
    with the rest."""
    executor = Executor()
    loop = new_loop(db, tmp_path, executor)
    advance(loop, 86_400)
    setup(loop, {"a": None}, quota=8)
    job = submit(loop, "a", gpus=4, tier=1, checkpoint_interval_s=600.0)
    tick(loop)
    started = row(loop, job)["started_at"]
    advance(loop, 119)
    tick(loop)  # charged for [start, start + 120)
    loop._last_now = started + 150
    call(loop, loop.commands.node_state, ADMIN, "n1", False, "fan")
    lost = loop.metrics.lost_gpu_hours._value.get()  # no checkpoint: all 150 s are lost
    assert lost == pytest.approx(4 * 150 / 3600)
    assert loop.accounts.spent["a"] == pytest.approx(0.0, abs=1e-9)  # and none of it is paid for
