"""Schema migrations: a database made by release 0.1.0 (commit 9b026ee, the last without
migrations) is upgraded in place by today's code with every row kept and is served as before;
a fresh database is made at the newest revision; a database of a newer release is refused in
one line and left untouched. On SQLite and PostgreSQL.

The 0.1.0 database is built from that release's own model classes and the rows its `make demo`
left (tests/fixtures/release_0_1_0/)."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, insert, select, text, update
from sqlalchemy.engine import Engine

from gpu_arbiter.control import schema
from gpu_arbiter.control.accounting import ledger_row, lost_gpu_seconds
from gpu_arbiter.control.bills import read_totals
from gpu_arbiter.control.books import read_books
from gpu_arbiter.control.launch import ServerProcess, free_port, start_agent
from gpu_arbiter.control.store import LEDGER, TABLES, Base, database_url, open_database
from gpu_arbiter.economy import Ledger
from gpu_arbiter.economy.report import bills_from_totals, team_bills
from tests.control.harness import database, wait_for
from tests.control.ledger_mix import assert_same_bills, mixed_ledger
from tests.fixtures.release_0_1_0 import store as release_0_1_0

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "release_0_1_0"
ROWS: dict[str, list[dict]] = json.loads((FIXTURE / "rows.json").read_text())
OLD_ADMIN = "release-0.1.0-admin"  # the fixture's admin token
SERIAL = ("tokens", "audit", "telemetry")  # tables whose integer ids the database hands out


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path):
    yield from database(request.param, tmp_path)


def build_release_0_1_0(db: str) -> None:
    """The database 0.1.0 would have left: its schema, made by its models, and its rows."""
    engine = create_engine(database_url(db))
    release_0_1_0.Base.metadata.create_all(engine)
    with engine.begin() as conn:
        for name, rows in ROWS.items():
            table = release_0_1_0.Base.metadata.tables[name]
            conn.execute(insert(table), rows)
            if conn.dialect.name == "postgresql" and name in SERIAL:
                # The rows came with their ids: move the serial on past them.
                seq = f"pg_get_serial_sequence('{name}', 'id')"
                conn.execute(text(f"SELECT setval({seq}, max(id)) FROM {name}"))
    engine.dispose()


def schema_differences(engine: Engine) -> list:
    with engine.connect() as conn:
        return compare_metadata(MigrationContext.configure(conn), Base.metadata)


def test_a_release_0_1_0_database_is_upgraded_in_place_with_every_row_kept(db):
    build_release_0_1_0(db)
    engine = open_database(db)
    try:
        with engine.connect() as conn:
            assert schema.current(conn) == schema.head()
            for name, rows in ROWS.items():
                table = TABLES[name]
                key = table.primary_key.columns.values()[0]
                kept = {r[key.name]: r for r in conn.execute(select(table)).mappings()}
                assert len(kept) == len(rows), name
                for row in rows:
                    assert {c: kept[row[key.name]][c] for c in row} == row, (name, row)
            teams = conn.execute(select(TABLES["teams"])).mappings().all()
            assert {(t["breaker_policy"], t["webhook_url"]) for t in teams} == {("stop", None)}
        assert schema_differences(engine) == []  # the same schema as a fresh database
    finally:
        engine.dispose()


def test_a_fresh_database_is_made_at_the_newest_revision(db):
    engine = open_database(db)
    try:
        with engine.connect() as conn:
            assert schema.current(conn) == schema.head()
        assert schema_differences(engine) == []
    finally:
        engine.dispose()


def test_a_database_of_a_newer_release_is_refused_and_left_as_it_is(db, tmp_path):
    open_database(db).dispose()
    engine = create_engine(database_url(db))
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(schema.NewerDatabase, match="revision 9999, made by a newer Arbiter"):
        open_database(db)
    cmd = [sys.executable, "-m", "gpu_arbiter.cli", "serve", "--db", db]
    cmd += ["--state-dir", str(tmp_path / "state"), "--port", str(free_port())]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "made by a newer Arbiter" in out.stderr
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "9999"
    engine.dispose()


def test_todays_serve_runs_a_release_0_1_0_database(db, tmp_path):
    """The upgraded service shows the old jobs and bill, and runs the job 0.1.0 left queued."""
    build_release_0_1_0(db)
    server = ServerProcess(db, tmp_path / "state", OLD_ADMIN, extra=["--allow-root-jobs"])
    server.start()
    agent = None
    try:
        assert "upgraded the database" in server.log()
        if db.endswith(".db"):
            assert Path(f"{db}.before-0001").is_file()  # the file as 0.1.0 left it
        admin = server.client()
        jobs = {j["id"]: j for j in admin.get("/v1/jobs").json()}
        assert [jobs[j]["state"] for j in ("j1", "j2", "j3", "j4", "j5")] == ["completed"] * 5
        assert jobs["j1"]["preemptions"] == 1 and jobs["j6"]["state"] == "pending"
        old_credits = sum(e["credits"] for e in ROWS["ledger"] if e["kind"] == "charge")
        charged = [e for e in admin.get("/v1/ledger").json() if e["kind"] == "charge"]
        assert sum(e["credits"] for e in charged) == pytest.approx(old_credits)
        agent = start_agent(
            server.url,
            OLD_ADMIN,
            "gpu-node-1",
            8,
            "H100",
            rack="rack0",
            log_path=tmp_path / "agent.log",
        )
        assert admin.post("/v1/nodes/gpu-node-1/uncordon").status_code == 200
        wait_for(lambda: admin.get("/v1/jobs/j6").json()["state"] == "completed")
    finally:
        if agent is not None:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=30)
        server.stop()
        server.kill()


def test_the_upgrade_does_not_run_again(tmp_path):
    db = str(tmp_path / "arbiter.db")
    build_release_0_1_0(db)
    open_database(db).dispose()
    engine = create_engine(database_url(db))
    assert schema.migrate(engine) is None
    with engine.begin() as conn:  # a row written after the upgrade survives a reopen
        conn.execute(
            update(TABLES["teams"]).where(TABLES["teams"].c.name == "nlp").values(weight=5)
        )
    open_database(db).dispose()
    with engine.connect() as conn:
        weight = conn.execute(
            select(TABLES["teams"].c.weight).where(TABLES["teams"].c.name == "nlp")
        )
        assert weight.scalar() == 5
    engine.dispose()


def test_the_upgrade_copies_what_the_sums_need_out_of_each_old_entry(db):
    """Schemas 0005 and 0006: the lost GPU-seconds of entries older releases wrote, and what a
    bill sums of them, come from their JSON, so the start-up sum of lost GPU-hours and the
    bills the database sums are what the entries say."""
    build_release_0_1_0(db)
    book = mixed_ledger(len(ROWS["ledger"]), 1_796_000_000.0)
    old = create_engine(database_url(db))
    with old.begin() as conn:
        conn.execute(
            insert(release_0_1_0.Base.metadata.tables["ledger"]),
            [
                {c: r[c] for c in ("seq", "kind", "team", "job_id", "at", "credits", "entry")}
                for r in (ledger_row(e, book) for e in book.entries())
            ],
        )
    old.dispose()
    engine = open_database(db)
    try:
        with engine.connect() as conn:
            lost = dict(conn.execute(select(LEDGER.c.seq, LEDGER.c.lost_gpu_seconds)).all())
            books = read_books(conn, 0, 0.0, 1.0)
            totals = read_totals(conn)
            rows = conn.execute(select(LEDGER.c.entry).order_by(LEDGER.c.seq)).all()
    finally:
        engine.dispose()
    expected = {e.seq: lost_gpu_seconds(e, book) for e in book.entries()}
    assert {seq: lost[seq] for seq in expected} == pytest.approx(expected, rel=1e-12)
    assert sum(v > 0 for v in expected.values()) == 9  # 3 re-runs, 3 lost-work, 3 given back
    assert [lost[r["seq"]] for r in ROWS["ledger"]] == [0.0] * len(ROWS["ledger"])
    assert books.lost_gpu_seconds == pytest.approx(math.fsum(expected.values()), rel=1e-12)
    whole = Ledger.from_lines(json.dumps(r.entry) for r in rows)
    assert_same_bills(
        [b.to_dict() for b in bills_from_totals(totals)],
        [b.to_dict() for b in team_bills(whole)],
    )
