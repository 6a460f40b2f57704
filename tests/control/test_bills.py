"""`GET /v1/bill` has the database sum the ledger (control/bills.py): the bills are the ones
`team_bills` adds up entry by entry over the whole ledger, with charges that grew as their
jobs ran, refunds, lost work, re-runs, grants and failures absorbed; the rows a request reads
do not grow with the ledger, and no entry's JSON is read. On SQLite and PostgreSQL."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from gpu_arbiter.control.accounting import ledger_row
from gpu_arbiter.control.bills import GROUPS, read_totals, spend_since
from gpu_arbiter.control.store import LEDGER, insert_rows, open_database
from gpu_arbiter.domain import JobSpec
from gpu_arbiter.economy import ChargeModel, Entry, Ledger
from gpu_arbiter.economy.report import bills_from_totals, team_bills
from gpu_arbiter.web.views import period_spend
from tests.control.direct import ADMIN, Executor, advance, call, new_loop, setup, submit, tick
from tests.control.harness import database, start_server
from tests.control.ledger_mix import assert_same_bills, mixed_ledger


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path):
    yield from database(request.param, tmp_path)


def whole_ledger(engine) -> Ledger:
    with engine.connect() as conn:
        rows = conn.execute(select(LEDGER.c.entry).order_by(LEDGER.c.seq)).all()
    return Ledger.from_lines(json.dumps(r.entry) for r in rows)


def append(engine, book_of) -> Ledger:
    """Append the entries `book_of(next_seq)` makes to the database's ledger."""
    with engine.begin() as conn:
        top = conn.execute(select(func.max(LEDGER.c.seq))).scalar()
        book = book_of(0 if top is None else top + 1)
        insert_rows(conn, LEDGER, [ledger_row(e, book) for e in book.entries()])
    return book


def test_the_bills_the_database_sums_are_those_of_every_entry(db, tmp_path, monkeypatch):
    engine = open_database(db)
    try:
        # The live service's own entries: a charge that grew as its job ran, then a node
        # failure that gave its seconds back (the job keeps checkpoints).
        executor = Executor()
        loop = new_loop(engine, tmp_path, executor)
        advance(loop, 86_400)
        setup(loop, {"a": 1e6, "b": None}, quota=8)
        submit(loop, "a", gpus=4, tier=1, checkpoint_interval_s=600.0)
        submit(loop, "b", gpus=2, tier=2)
        tick(loop)
        for _ in range(4):
            advance(loop, 61)
            tick(loop)
        call(loop, loop.commands.node_state, ADMIN, "n1", False, "fan")
        tick(loop)
        append(engine, lambda seq: mixed_ledger(seq, loop.now() - 40 * 86_400))

        whole = whole_ledger(engine)
        burn = {"a": 3.5, "idle": 1.25}
        want = [b.to_dict() for b in team_bills(whole, burn_rates=burn)]
        reasons = {e.reason for e in whole.entries()}
        assert {"run", "rerun", "lost-work", "failure-absorbed", "ended-earlier"} <= reasons
        assert any(e.useful_gpu_seconds for e in whole.entries())
        monkeypatch.setattr(Entry, "from_json", None)  # no entry's JSON is read
        with engine.connect() as conn:
            totals = read_totals(conn)
            groups = len(conn.execute(GROUPS).all())
        monkeypatch.undo()
        got = [b.to_dict() for b in bills_from_totals(totals, burn_rates=burn)]
        assert_same_bills(got, want)

        # A thousand more runs of a team on the same terms add no row to what a bill reads.
        def runs(seq: int) -> Ledger:
            book = Ledger.resume(seq, {})
            spec = JobSpec(id="more", team="vision", gpus=2, tier=1)
            for k in range(1000):
                ChargeModel().charge_segment(
                    book, spec, gpu_type="H100", tier=1, gpus=2,
                    start=1e9 + 60 * k, end=1e9 + 60 * k + 59.5, preemptible=False,
                )  # fmt: skip
            return book

        append(engine, runs)
        with engine.connect() as conn:
            assert len(conn.execute(GROUPS).all()) == groups
            totals = read_totals(conn)
        want = [b.to_dict() for b in team_bills(whole_ledger(engine))]
        assert_same_bills([b.to_dict() for b in bills_from_totals(totals)], want)
        vision = next(b for b in want if b["team"] == "vision")
        assert vision["credits_charged"] > 1000 * 2 * 59.5 / 3600
    finally:
        engine.dispose()


def test_the_dashboard_spend_the_database_sums_is_that_of_the_period_entries(db, monkeypatch):
    engine = open_database(db)
    try:
        start = 1.7e9
        book = append(engine, lambda seq: mixed_ledger(seq, start))
        entries = book.entries()
        since = sorted(e.at for e in entries)[len(entries) // 2]  # a period begun mid-ledger
        with engine.connect() as conn:
            rows = conn.execute(select(LEDGER.c.entry).where(LEDGER.c.at >= since)).all()
        want = period_spend(r.entry for r in rows)
        assert len(want) >= 2 and any(s.useful_gpu_seconds < s.gpu_seconds for s in want.values())
        monkeypatch.setattr(Entry, "from_json", None)  # no entry's JSON is read
        with engine.connect() as conn:
            got = period_spend(spend_since(conn, since))
        assert got.keys() == want.keys()
        for team, s in want.items():
            assert got[team].credits == pytest.approx(s.credits)
            assert got[team].gpu_seconds == pytest.approx(s.gpu_seconds)
            assert got[team].useful_gpu_seconds == pytest.approx(s.useful_gpu_seconds)
    finally:
        engine.dispose()


def test_a_live_server_bills_what_the_whole_ledger_says(db, tmp_path):
    """`GET /v1/bill` on a served database, and a team sees its own bill only."""
    engine = open_database(db)
    try:
        whole = append(engine, lambda seq: mixed_ledger(seq, 1_790_000_000.0))
    finally:
        engine.dispose()
    want = [b.to_dict() for b in team_bills(whole)]
    server = start_server(db, tmp_path / "state")
    try:
        admin = server.client()
        assert_same_bills(admin.get("/v1/bill").json(), want)
        admin.put("/v1/teams/nlp", json={"quota": {}}).raise_for_status()
        r = admin.post("/v1/tokens", json={"team": "nlp"})
        r.raise_for_status()
        nlp = server.client(r.json()["token"])
        assert_same_bills(nlp.get("/v1/bill").json(), [b for b in want if b["team"] == "nlp"])
    finally:
        server.close()
