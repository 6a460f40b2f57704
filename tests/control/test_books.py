"""A restart reads the ledger's sums, not its history (control/books.py), and a long uptime
keeps only the open part of the ledger in memory; the books stay exactly what the whole ledger
says: spend and budgets per team and period, the bill, every second of a run charged once. On
SQLite and PostgreSQL, over a ledger written the way the previous release wrote it (one "run"
charge per running job per minute)."""

from __future__ import annotations

import json
import math

import pytest
from sqlalchemy import func, select

from gpu_arbiter.control.accounting import ledger_row
from gpu_arbiter.control.store import LEDGER, insert_rows, open_database
from gpu_arbiter.domain import JobSpec, Team
from gpu_arbiter.economy import Budgets, ChargeModel, Entry, Ledger
from gpu_arbiter.economy.report import team_bills
from tests.control.direct import (
    ADMIN,
    Executor,
    advance,
    call,
    new_loop,
    row,
    set_time,
    setup,
    submit,
    tick,
)
from tests.control.harness import database

HISTORY_JOBS, HISTORY_MINUTES = 20, 60  # 1200 minute charges of jobs long finished


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path):
    for url in database(request.param, tmp_path):
        engine = open_database(url)
        yield engine
        engine.dispose()


def whole_ledger(loop) -> Ledger:
    """Every entry in the database, each re-checked (what `/v1/bill` and an auditor read)."""
    with loop.connection() as conn:
        rows = conn.execute(select(LEDGER.c.entry).order_by(LEDGER.c.seq)).all()
    return Ledger.from_lines(json.dumps(r.entry) for r in rows)


def write_old_minutes(loop, spec: JobSpec, start: float, minutes: int) -> None:
    """One "run" charge per minute of [start, start + minutes·60), appended to the database's
    ledger as the previous release's accrual wrote them."""
    with loop.connection() as conn:
        top = conn.execute(select(func.max(LEDGER.c.seq))).scalar()
        tail = Ledger.resume(0 if top is None else top + 1, {})
        for k in range(minutes):
            ChargeModel().charge_segment(
                tail,
                spec,
                gpu_type="H100",
                tier=spec.tier,
                gpus=spec.gpus,
                start=start + 60 * k,
                end=start + 60 * (k + 1),
                preemptible=False,
            )
        insert_rows(conn, LEDGER, [ledger_row(e, tail) for e in tail.entries()])


def assert_books_match(loop, teams: list[Team]) -> Ledger:
    """The loop's spend and budgets are what the whole ledger in the database says."""
    whole = whole_ledger(loop)
    whole.check_balanced()
    now = loop.now()
    budgets = Budgets.for_teams(whole, teams)
    for bill in team_bills(whole):
        assert loop.accounts.spent.get(bill.team, 0.0) == pytest.approx(
            bill.credits_spent, rel=1e-9, abs=1e-9
        )
        assert loop.accounts.budgets.remaining(bill.team, now) == pytest.approx(
            budgets.remaining(bill.team, now), rel=1e-9, abs=1e-9
        )
    return whole


def test_a_restart_reads_the_open_charges_not_the_history_and_the_books_stay_exact(
    db, tmp_path, monkeypatch
):
    executor = Executor()
    loop = new_loop(db, tmp_path, executor)
    advance(loop, 86_400)
    setup(loop, {"a": 1e6, "b": None}, quota=8)
    teams = [Team("a", budget_per_period=1e6), Team("b")]
    job = submit(loop, "a", gpus=4, tier=1, checkpoint_interval_s=600.0)
    tick(loop)
    started = row(loop, job)["started_at"]
    for k in range(HISTORY_JOBS):  # jobs long finished, in this budget period
        old = JobSpec(id=f"old{k}", team="ab"[k % 2], gpus=2, tier=2)
        write_old_minutes(loop, old, started - 2 * 86_400 + k * 3600, HISTORY_MINUTES)
    # The running job was charged by the minute by the previous release: 10 minutes so far.
    spec = JobSpec(id=job, team="a", gpus=4, tier=1, checkpoint_interval_s=600.0)
    write_old_minutes(loop, spec, started, 10)

    parsed: list[int] = []
    from_json = Entry.from_json.__func__  # type: ignore[attr-defined]

    def counting(cls, data, where="ledger entry"):
        parsed.append(data["seq"])
        return from_json(cls, data, where)

    monkeypatch.setattr(Entry, "from_json", classmethod(counting))
    monkeypatch.setattr(Ledger, "from_lines", None)  # the whole ledger is never read
    loop2 = new_loop(db, tmp_path, executor)
    monkeypatch.undo()
    assert len(parsed) == 10  # the running job's open charges, whatever the history's length
    assert loop2.accounts.ledger.entries() == ()
    assert len(loop2.accounts.ledger) == HISTORY_JOBS * HISTORY_MINUTES + 10 + 1  # + the grant
    set_time(loop2, started + 10 * 60)
    assert_books_match(loop2, teams)

    # It runs on: its next accrual starts one growing charge after the old minutes ...
    for _ in range(5):
        advance(loop2, 60)
        tick(loop2)
    assert_books_match(loop2, teams)
    # ... and a node failure with no checkpoint saved gives back every second it was charged.
    advance(loop2, 30)
    call(loop2, loop2.commands.node_state, ADMIN, "n1", False, "fan")
    ended = loop2.now()
    whole = assert_books_match(loop2, teams)
    held = [e for e in whole.audit(job) if e.kind == "charge"]
    assert math.fsum(e.gpu_seconds for e in held) == pytest.approx(4 * (ended - started))
    assert [(a.end, b.start) for a, b in zip(held, held[1:], strict=False)] == [
        (a.end, a.end) for a in held[:-1]
    ]  # consecutive: each second charged once
    net = math.fsum(e.credits if e.kind == "charge" else -e.credits for e in whole.audit(job))
    assert net == pytest.approx(0.0, abs=1e-9)  # the cluster absorbed the lost work
    lost = loop2.metrics.lost_gpu_hours._value.get()
    assert lost == pytest.approx(4 * (ended - started) / 3600)
    loop3 = new_loop(db, tmp_path, executor)  # the rows say so too: a restart sums them
    assert loop3.metrics.lost_gpu_hours._value.get() == pytest.approx(lost, rel=1e-12)


def test_a_long_uptime_keeps_only_the_open_part_of_the_ledger_in_memory(db, tmp_path):
    executor = Executor()
    loop = new_loop(db, tmp_path, executor)
    loop.accounts.keep_at_most = 2
    advance(loop, 86_400)
    setup(loop, {"a": 1e6, "b": None}, quota=8)
    teams = [Team("a", budget_per_period=1e6), Team("b")]
    long = submit(loop, "a", gpus=4, tier=1)
    tick(loop)
    started = row(loop, long)["started_at"]
    for k in range(6):  # short jobs come and go beside the long one
        short = submit(loop, "ab"[k % 2], gpus=2, tier=2)
        tick(loop)
        advance(loop, 90)
        tick(loop)
        call(loop, loop.commands.cancel, ADMIN, short)
        tick(loop)
        assert len(loop.accounts.ledger.entries()) <= 2 + 3
    assert len(whole_ledger(loop)) > 6
    assert_books_match(loop, teams)
    advance(loop, 30)
    call(loop, loop.commands.cancel, ADMIN, long)
    ended = loop.now()
    whole = assert_books_match(loop, teams)
    runs = [e for e in whole.audit(long) if e.kind == "charge"]
    assert len(runs) == 2  # the charge that grew while it ran, then the rest
    assert (runs[0].start, runs[0].end, runs[1].end) == (started, runs[1].start, ended)
