"""The control plane's durable state: SQLAlchemy models and the database engine.

One schema serves SQLite (the default, a single file) and PostgreSQL (production). The
database is the source of truth: the scheduling engine's in-memory view is rebuilt from it on
every start, so anything committed here survives a `kill -9`.

SQLite runs in WAL mode with `synchronous=FULL`, so a commit is on disk before the API answers,
and readers (the API's list and show endpoints) never block the single writer (the control
loop). Only the control loop writes; see `loop.py`. The tables' handles (`JOBS`, ...) are
here, for the loop that writes them and the API and dashboard that read them.
"""

from __future__ import annotations

import select as select_io
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Insert,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    bindparam,
    create_engine,
    event,
    func,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from gpu_arbiter.domain import InvalidInput


class Base(DeclarativeBase):
    pass


class TeamRow(Base):
    __tablename__ = "teams"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    quota: Mapped[dict[str, int]] = mapped_column(JSON, default=dict)
    budget_per_period: Mapped[float | None] = mapped_column(Float, nullable=True)
    # What a tripped circuit breaker does to the team's jobs (stop | flag), and where the team
    # is told (a webhook URL, a Slack incoming webhook or alike).
    breaker_policy: Mapped[str] = mapped_column(String(8), default="stop", server_default="stop")
    webhook_url: Mapped[str | None] = mapped_column(Text, nullable=True)
    run_as: Mapped[str | None] = mapped_column(String(32), nullable=True)  # unix user of its jobs


class TokenRow(Base):
    """An API token. Only its SHA-256 is stored: tokens are 256-bit random strings, so a fast
    hash is enough (no dictionary to guess from) and keeps authentication off the hot path."""

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hash: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))  # admin | team | agent
    team: Mapped[str | None] = mapped_column(String(64), nullable=True)
    label: Mapped[str] = mapped_column(String(128), default="")
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class NodeRow(Base):
    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    gpu_type: Mapped[str] = mapped_column(String(32))
    gpus: Mapped[int] = mapped_column(Integer)
    rack: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16), default="up")  # up | down | cordoned
    reason: Mapped[str] = mapped_column(Text, default="")
    registered_at: Mapped[float] = mapped_column(Float)
    last_heartbeat: Mapped[float | None] = mapped_column(Float, nullable=True)
    health: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class JobRow(Base):
    """A job as submitted (`spec`, the engine's JobSpec fields) and what became of it. The
    `seg_*` columns describe the run segment in progress, so it can be charged when it ends
    even after a restart."""

    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("team", "client_key", name="uq_jobs_team_client_key"),
        Index("ix_jobs_team_state", "team", "state"),
        Index("ix_jobs_state", "state"),
    )

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    team: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(128), default="")
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    env: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    tier: Mapped[int] = mapped_column(Integer)  # the tier it runs at (after admission)
    state: Mapped[str] = mapped_column(String(16))
    preempting: Mapped[bool] = mapped_column(Boolean, default=False)
    client_key: Mapped[str | None] = mapped_column(String(128), nullable=True)
    request_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    submitted_at: Mapped[float] = mapped_column(Float)
    first_start: Mapped[float | None] = mapped_column(Float, nullable=True)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    allocation: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    seg_start: Mapped[float | None] = mapped_column(Float, nullable=True)
    seg_gpu_type: Mapped[str | None] = mapped_column(String(32), nullable=True)
    seg_gpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    seg_tier: Mapped[int | None] = mapped_column(Integer, nullable=True)
    seg_borrowed: Mapped[bool] = mapped_column(Boolean, default=False)
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    last_checkpoint_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    telemetry: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # the latest report


# The ledger's columns the bills and the start-up sums read, grouping ones first.
SUMMED = (
    "team",
    "kind",
    "reason",
    "gpu_type",
    "tier",
    "credits",
    "gpu_seconds",
    "useful_gpu_seconds",
    "lost_gpu_seconds",
)


class LedgerRow(Base):
    """One `economy.Entry`, kept whole in `entry` so the ledger rebuilds exactly; the other
    columns are for queries."""

    __tablename__ = "ledger"
    # Every column the bills and the start-up sums read, so the database sums an index in
    # its order instead of reading (and sorting) the rows, which hold each entry's JSON.
    __table_args__ = (Index("ix_ledger_sums", *SUMMED),)

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    kind: Mapped[str] = mapped_column(String(16))
    team: Mapped[str] = mapped_column(String(64))  # indexed first in ix_ledger_sums
    # Indexed: a restart reads the running jobs' charges and the current period's sums.
    job_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    credits: Mapped[float] = mapped_column(Float)
    # GPU-seconds this entry says a failure lost (`accounting.lost_gpu_seconds`), so the
    # lost-GPU-hours sum is a column's, not every entry's JSON.
    lost_gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    # What a bill sums (control/bills.py), copied from the entry so the database sums them.
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    gpu_type: Mapped[str | None] = mapped_column(String(32), nullable=True)
    tier: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gpu_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    useful_gpu_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    entry: Mapped[dict[str, Any]] = mapped_column(JSON)


class AuditRow(Base):
    __tablename__ = "audit"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(64))
    subject: Mapped[str] = mapped_column(String(128), index=True)  # a job page reads by it
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class TelemetryRow(Base):
    __tablename__ = "telemetry"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(64), ForeignKey("jobs.id"), index=True)
    at: Mapped[float] = mapped_column(Float)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)


class SettingRow(Base):
    """Small documents the admin sets (the price table)."""

    __tablename__ = "settings"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[dict[str, Any]] = mapped_column(JSON)


def database_url(db: str) -> str:
    """A SQLAlchemy URL from what a user types: a file path, `sqlite:///...` or
    `postgresql://...` (driven by psycopg 3)."""
    if db.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + db.split("://", 1)[1]
    if "://" in db:
        if not db.startswith(("sqlite://", "postgresql+")):
            raise InvalidInput(f"--db {db!r}: expected a file path, sqlite:/// or postgresql://")
        return db
    return f"sqlite:///{Path(db).expanduser().resolve()}"


def open_database(db: str) -> Engine:
    """Create the engine and bring the schema to this release's (`schema.migrate`: created,
    upgraded in place, or a newer one refused). SQLite gets WAL + synchronous=FULL + a busy
    timeout (readers and the writer live in different threads)."""
    url = database_url(db)
    if url.startswith("sqlite"):
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, pool_size=8
        )

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

    else:
        try:
            engine = create_engine(url, pool_size=8, pool_pre_ping=True)
        except ModuleNotFoundError as e:
            raise InvalidInput(
                f"--db {db!r}: PostgreSQL needs psycopg (pip install 'gpu-arbiter[postgres]'): {e}"
            ) from None
    from gpu_arbiter.control.schema import migrate  # alembic's revisions import this module

    migrate(engine)
    return engine


TABLES = Base.metadata.tables
JOBS, TEAMS, NODES, TOKENS = TABLES["jobs"], TABLES["teams"], TABLES["nodes"], TABLES["tokens"]
LEDGER, AUDIT, TELEMETRY, SETTINGS = (
    TABLES["ledger"],
    TABLES["audit"],
    TABLES["telemetry"],
    TABLES["settings"],
)


def set_node(conn: Connection, name: str, **values: Any) -> None:
    """Change columns of one node's row: the one way a node's row changes after it is
    registered, whoever changes it (a command, a health verdict, a decision)."""
    conn.execute(update(NODES).where(NODES.c.name == name).values(**values))


def setting(conn: Connection, key: str) -> dict[str, Any] | None:
    """A document the server keeps under `key` (`SettingRow`), or None."""
    return conn.execute(select(SETTINGS.c.value).where(SETTINGS.c.key == key)).scalar()


def put_setting(conn: Connection, key: str, value: dict[str, Any]) -> None:
    """Keep `value` under `key`, added or replaced in one statement (an upsert, which both
    SQLite and PostgreSQL express as INSERT ... ON CONFLICT DO UPDATE)."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(SETTINGS).values(key=key, value=value)
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=[SETTINGS.c.key], set_={"value": stmt.excluded["value"]}
        )
    )


def insert_rows(conn: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> None:
    """Insert `rows` (all with the same keys) in their order: an executemany on SQLite; on
    PostgreSQL one statement with the rows as one JSON parameter. psycopg's executemany adapts
    every value of every row in Python and sends a statement per row, which cost a batch of
    submissions several times the CPU and time of the rest of its transaction."""
    if conn.dialect.name == "postgresql":
        conn.execute(_insert_from_json(table, tuple(rows[0])), {"rows": rows})
    else:
        conn.execute(insert(table), rows)


@cache
def _insert_from_json(table: Table, columns: tuple[str, ...]) -> Insert:
    """INSERT INTO t (columns) SELECT columns FROM json_populate_recordset(NULL::t, :rows) in
    the array's order (so serial ids follow it). Built once per table and columns: building the
    construct costs more than running it. The record's columns are read by name, never renamed
    by position: a column a migration added comes last in the database's table, wherever the
    model declares it."""
    rows = func.json_populate_recordset(
        literal_column(f"NULL::{table.name}"), bindparam("rows", type_=JSON)
    )
    # PostgreSQL names the WITH ORDINALITY column "ordinality" when the alias lists no names.
    src = rows.table_valued(*columns, with_ordinality="ordinality")
    return insert(table).from_select(
        list(columns), select(*(src.c[c] for c in columns)).order_by(src.c.ordinality)
    )


def dropped(conn: Connection) -> bool:
    """Whether the database has dropped `conn`, an idle connection, as far as can be seen
    without a round trip: PostgreSQL's socket has something to read (the server's goodbye and
    end of file) though no query is running. A SQLite file is never dropped."""
    if conn.dialect.name != "postgresql":
        return False
    fileno = conn.connection.driver_connection.fileno()  # type: ignore[union-attr]
    return bool(select_io.select([fileno], [], [], 0)[0])
