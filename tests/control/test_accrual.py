"""Live cost (E1, E5): running jobs are charged as they run, once per second held, across
restarts, by one charge that grows (so the ledger does not grow with the minutes a job runs);
a team that spends its budget mid-run has its running jobs capped at the tier an exhausted
budget allows."""

from __future__ import annotations

import json
import math
import time

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from gpu_arbiter.control.config import ServerConfig
from gpu_arbiter.control.loop import ControlLoop
from gpu_arbiter.control.store import JOBS, LEDGER, open_database
from gpu_arbiter.domain import JobFinished, JobSpec
from gpu_arbiter.economy import ChargeModel, Ledger
from gpu_arbiter.economy.report import team_bills
from tests.control.direct import (
    ADMIN,
    Clock,
    Executor,
    advance,
    call,
    charges,
    new_loop,
    row,
    set_time,
    setup,
    submit,
    tick,
)
from tests.control.harness import database


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path):
    for url in database(request.param, tmp_path):
        engine = open_database(url)
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
    assert job in executor.jobs and started == loop.now()

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
    assert [(e.start, e.end) for e in charges(loop, job)] == [(started, started + 190)]

    # A restart reads what was charged from the ledger: the end charges only the rest.
    loop2 = new_loop(db, tmp_path, executor)
    assert loop2.state.sched is not None and job in loop2.state.sched.running
    set_time(loop2, started + 200)
    call(loop2, loop2.commands.cancel, ADMIN, job)
    pieces = charges(loop2, job)
    assert [(e.start, e.end) for e in pieces] == [
        (started, started + 190),
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
    assert loop.accounts.budgets.can_spend("a", loop.now())

    advance(loop, 1800)
    tick(loop)
    assert loop.accounts.budgets.can_spend("a", loop.now()) and row(loop, job)["tier"] == 1
    advance(loop, 1800)
    tick(loop)
    assert not loop.accounts.budgets.can_spend("a", loop.now())
    assert loop.state.sched is not None and int(loop.state.sched.jobs[job].tier) == 3
    now = row(loop, job)
    assert now["state"] == "running" and now["tier"] == 3 and "budget" in now["reason"]
    demoted_at = loop.now()
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
    set_time(loop, started + 150)
    call(loop, loop.commands.node_state, ADMIN, "n1", False, "fan")
    lost = loop.metrics.lost_gpu_hours._value.get()  # no checkpoint: all 150 s are lost
    assert lost == pytest.approx(4 * 150 / 3600)
    assert loop.accounts.spent["a"] == pytest.approx(0.0, abs=1e-9)  # and none of it is paid for


def _ledger_rows(loop, job_id: str | None = None) -> list[dict]:
    """The ledger as the database holds it (what a restart, the bill and the export read)."""
    q = select(LEDGER.c.entry).order_by(LEDGER.c.seq)
    if job_id is not None:
        q = q.where(LEDGER.c.job_id == job_id)
    with loop.connection() as conn:
        return [r.entry for r in conn.execute(q)]


def _run_minutes(loop, minutes: int) -> None:
    for _ in range(minutes):
        advance(loop, 60)
        tick(loop)


def test_a_job_running_for_hours_leaves_a_bounded_number_of_ledger_rows_and_the_same_bill(
    db, tmp_path
):
    """Three hours of accrual leave one growing charge, not 180, and the bill is what one
    charge per minute (the old ledger) made of the same seconds."""
    executor = Executor()
    loop = new_loop(db, tmp_path, executor)
    advance(loop, 86_400)
    setup(loop, {"a": None}, quota=8)
    job = submit(loop, "a", gpus=4, tier=1, checkpoint_interval_s=600.0)
    tick(loop)
    started = row(loop, job)["started_at"]
    _run_minutes(loop, 10)
    assert len(_ledger_rows(loop, job)) == 1
    _run_minutes(loop, 170)
    rows = _ledger_rows(loop, job)
    assert len(rows) == 1 and rows[0]["start"] == started
    billed_to = rows[0]["end"]
    assert billed_to > started + 3 * 3600 - 120
    advance(loop, 30)
    call(loop, loop.commands.cancel, ADMIN, job)
    ended = loop.now()
    assert len(_ledger_rows(loop, job)) == 2

    book = Ledger.from_lines(json.dumps(e) for e in _ledger_rows(loop))
    book.check_balanced()
    (bill,) = team_bills(book)
    # The same seconds charged the old way: one "run" charge per minute, then the rest.
    minutes = Ledger()
    spec = JobSpec(id=job, team="a", gpus=4, tier=1, checkpoint_interval_s=600.0)
    edges = [started + 60 * k for k in range(int((billed_to - started) // 60) + 1)]
    edges += [billed_to, ended]
    for a, b in zip(edges, edges[1:], strict=False):
        if b > a:
            ChargeModel().charge_segment(
                minutes, spec, gpu_type="H100", tier=1, gpus=4, start=a, end=b, preemptible=False
            )
    (old,) = team_bills(minutes)
    assert len(minutes) > 180
    # Equal but for float rounding: a sum of 180 products against one product.
    assert dict(bill.gpu_hours) == pytest.approx(dict(old.gpu_hours), rel=1e-12)
    assert bill.gpu_hours_total == pytest.approx(4 * (ended - started) / 3600, rel=1e-12)
    assert bill.credits_charged == pytest.approx(old.credits_charged, rel=1e-12)
    assert (bill.credits_refunded, old.credits_refunded) == (0.0, 0.0)
    assert loop.accounts.spent["a"] == pytest.approx(bill.credits_spent, rel=1e-12)


def test_a_restart_mid_run_charges_each_second_exactly_once(db, tmp_path):
    """The growing charge is written in the transaction that grew it: a restart (or a failed
    transaction's rebuild) carries on from its end, never before it, never after it."""
    executor = Executor()
    loop = new_loop(db, tmp_path, executor)
    advance(loop, 86_400)
    setup(loop, {"a": None}, quota=8)
    job = submit(loop, "a", gpus=4, tier=1)
    tick(loop)
    started = row(loop, job)["started_at"]
    _run_minutes(loop, 30)
    charged = loop.accounts.spent["a"]
    (grown,) = _ledger_rows(loop, job)
    assert grown["end"] > started + 29 * 60 and grown["credits"] == pytest.approx(charged)

    loop2 = new_loop(db, tmp_path, executor)
    assert loop2.accounts.spent["a"] == pytest.approx(charged, rel=1e-12)
    set_time(loop2, loop.now())
    _run_minutes(loop2, 30)
    loop2.load()  # what a failed transaction does: the books again from the database
    _run_minutes(loop2, 30)
    advance(loop2, 30)
    call(loop2, loop2.commands.cancel, ADMIN, job)
    ended = loop2.now()
    pieces = [e for e in _ledger_rows(loop2, job) if e["kind"] == "charge"]
    assert len(pieces) == 2  # the grown one and the rest at the end
    assert [(p["start"], p["end"]) for p in pieces] == [
        (started, pieces[1]["start"]),
        (pieces[1]["start"], ended),
    ]
    assert math.fsum(p["gpu_seconds"] for p in pieces) == pytest.approx(4 * (ended - started))
    assert loop2.accounts.spent["a"] == pytest.approx(3.5 * 4 * (ended - started) / 3600, rel=1e-12)


def test_a_charge_never_grows_into_the_next_budget_period(db, tmp_path):
    """Budgets count a charge in the period of its date, so the growing charge stops at a
    period's end and a new one starts: each period's spend stays exact."""
    executor = Executor()
    loop = new_loop(db, tmp_path, executor)
    period_s = loop.accounts.budgets.policy.period_s
    boundary = (math.floor(time.time() / period_s) + 1) * period_s
    set_time(loop, boundary - 600)
    setup(loop, {"a": 1000.0}, quota=8)
    job = submit(loop, "a", gpus=4, tier=1)
    tick(loop)
    _run_minutes(loop, 20)
    budgets = loop.accounts.budgets
    runs = [e for e in _ledger_rows(loop, job) if e["kind"] == "charge"]
    assert len(runs) == 2
    before, after = (budgets.period_index(e["at"]) for e in runs)
    assert after == before + 1
    assert runs[0]["end"] == runs[1]["start"] and runs[0]["end"] <= boundary + 60
    for index, run in zip((before, after), runs, strict=True):
        at = budgets.period_start(index)
        assert budgets.remaining("a", at) == pytest.approx(1000.0 - run["credits"], rel=1e-12)


class Gone(Executor):
    """A backend whose jobs all ended while the control plane was down, each at the time the
    server last knew it running (as the Slurm backend puts an exit record's earlier end)."""

    def __init__(self, db: Engine | None = None) -> None:
        super().__init__()
        self.asked: list[tuple[str, float, float]] = []
        self.forgotten: list[tuple[str, str]] = []  # (job, its state in the database then)
        self.db = db

    def outcome(self, job_id: str, since: float, alive_at: float) -> JobFinished:
        self.asked.append((job_id, since, alive_at))
        return JobFinished(job_id, alive_at)

    def forget(self, job_id: str) -> None:
        with self.db.connect() as conn:
            state = conn.execute(select(JOBS.c.state).where(JOBS.c.id == job_id)).scalar()
        self.forgotten.append((job_id, state))


def test_a_restart_tells_the_backend_when_it_last_knew_a_job_that_ended_running(db, tmp_path):
    """A job that ended while the server was down is charged at least up to its last
    accrual: the backend hears when that was, to bound an end only the job vouches for."""
    loop = new_loop(db, tmp_path, Executor())
    advance(loop, 86_400)
    setup(loop, {"a": None}, quota=8)
    job = submit(loop, "a", gpus=4, tier=1)
    tick(loop)
    started = row(loop, job)["started_at"]
    _run_minutes(loop, 5)
    billed_to = loop.accounts.segs[job].billed_to
    assert billed_to > started + 4 * 60

    gone = Gone(db)
    clock = Clock()
    clock.t = billed_to + 3600  # the restart, an hour later
    cfg = ServerConfig(state_dir=tmp_path, accrue_s=60.0, heartbeat_timeout_s=1e9)
    loop2 = ControlLoop(db, gone, cfg, clock=clock)  # type: ignore[arg-type]
    loop2.load()
    assert gone.asked == [(job, started, billed_to)]
    assert gone.forgotten == [(job, "completed")]  # the backend's record goes once it is kept
    done = row(loop2, job)
    assert (done["state"], done["finished_at"]) == ("completed", billed_to)
    entries = _ledger_rows(loop2, job)
    assert [e["reason"] for e in entries] == ["run"]  # nothing given back
    assert entries[0]["end"] == billed_to
