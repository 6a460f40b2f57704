"""The control loop's writes, on SQLite and PostgreSQL: every row of a batch is written once,
with its values as given, in the order given (serial ids follow it), and a connection the
database dropped is replaced before a batch uses it."""

from __future__ import annotations

import time
from concurrent.futures import Future

import pytest
from sqlalchemy import select, text

from gpu_arbiter.control.auth import Principal
from gpu_arbiter.control.config import ServerConfig
from gpu_arbiter.control.loop import Command, ControlLoop
from gpu_arbiter.control.schemas import JobSubmit, NodeRegister, TeamPut
from gpu_arbiter.control.store import (
    AUDIT,
    JOBS,
    insert_rows,
    open_database,
    put_setting,
    setting,
)
from gpu_arbiter.domain import InvalidInput
from tests.control.harness import NoBackend, database


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request, tmp_path):
    for url in database(request.param, tmp_path):
        engine = open_database(url)
        yield engine
        engine.dispose()


def test_insert_rows_keeps_every_value_and_the_order(engine):
    rows = [
        {
            "at": 1796244968.3488555 + i / 7,
            "actor": "team:ü\"'\\x",
            "action": "submit",
            "subject": f"j{i}",
            "detail": {"n": i, "none": None, "ok": i % 2 == 0, "list": [1.5, "a\nb"]},
        }
        for i in range(50)
    ]
    with engine.begin() as conn:
        insert_rows(conn, AUDIT, rows)
    with engine.connect() as conn:
        stored = conn.execute(select(AUDIT).order_by(AUDIT.c.id)).mappings().all()
    assert [{k: r[k] for k in rows[0]} for r in stored] == rows


def test_a_setting_is_added_then_replaced_in_place(engine):
    with engine.begin() as conn:
        assert setting(conn, "prices") is None
        put_setting(conn, "prices", {"currency": "EUR", "on_demand": {"1": 3.0}})
    with engine.begin() as conn:
        put_setting(conn, "prices", {"currency": "USD"})
        put_setting(conn, "other", {"x": [1, None]})
    with engine.connect() as conn:
        assert setting(conn, "prices") == {"currency": "USD"}
        assert setting(conn, "other") == {"x": [1, None]}


def _loop(engine, tmp_path) -> ControlLoop:
    """A loop (not started: the test runs its batches) with one 8-GPU node and team t."""
    loop = ControlLoop(engine, NoBackend(), ServerConfig(state_dir=tmp_path))  # type: ignore[arg-type]
    loop.load()
    admin = Principal("admin", None, 0)
    node = NodeRegister(gpu_type="H100", gpus=8)
    loop.transaction(lambda tx: loop.commands.register_node(tx, admin, "n1", node))
    loop.tick()
    loop.transaction(lambda tx: loop.commands.put_team(tx, admin, "t", TeamPut(quota={"H100": 4})))
    loop.tick()
    return loop


def _submit(loop: ControlLoop, key: str, gpus: int = 1) -> Command:
    req = JobSubmit(command=f"run {key}", gpus=gpus, tier=1 + gpus % 3)
    who = Principal("team", "t", 1)
    return Command(loop.commands.submit, (who, req, key, f"hash-{key}-{gpus}"), Future())


def test_a_batch_of_submissions_is_written_once_each(engine, tmp_path):
    """One batch of the loop with new jobs, a repeated idempotency key and a refused request:
    each new job is one row and one audit row, in submission order; the repeat and the refusal
    write nothing."""
    loop = _loop(engine, tmp_path)
    batch = [_submit(loop, f"k{i}", 1 + i % 8) for i in range(40)]
    batch += [_submit(loop, "k3", 4), _submit(loop, "k-too-big", 64)]
    loop.run_batch(batch)

    assert [c.future.result()[1] for c in batch[:40]] == [True] * 40
    assert batch[40].future.result() == (batch[3].future.result()[0], False)
    with pytest.raises(InvalidInput, match="needs 64 GPUs"):
        batch[41].future.result()
    ids = [c.future.result()[0]["id"] for c in batch[:40]]
    with engine.connect() as conn:
        jobs = conn.execute(select(JOBS).order_by(JOBS.c.seq)).mappings().all()
        audit = conn.execute(select(AUDIT).order_by(AUDIT.c.id)).mappings().all()
    assert [j["id"] for j in jobs] == ids
    assert [(j["client_key"], j["spec"]["command"]) for j in jobs] == [
        (f"k{i}", f"run k{i}") for i in range(40)
    ]
    assert [a["subject"] for a in audit if a["action"] == "submit"] == ids
    assert [dict(j) for j in jobs] == [
        {**j, **c.future.result()[0]} for j, c in zip(jobs, batch[:40], strict=True)
    ]


def test_a_connection_the_database_dropped_is_replaced_before_the_next_batch(engine, tmp_path):
    """The loop keeps its connection between batches; when PostgreSQL ends it (a restart, an
    administrator), the next batch still commits instead of failing on the dead connection."""
    if engine.dialect.name != "postgresql":
        pytest.skip("a SQLite file cannot drop a connection")
    loop = _loop(engine, tmp_path)
    others = text(
        "SELECT pid FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    with engine.connect() as conn:
        pids = conn.execute(others).scalars().all()
        assert pids
        conn.execute(text("SELECT pg_terminate_backend(pid) FROM unnest(:p) pid"), {"p": pids})
        conn.commit()
        while set(pids) & set(conn.execute(others).scalars()):
            conn.commit()  # a transaction sees one snapshot of pg_stat_activity
            time.sleep(0.01)  # gone from it after its goodbye reached the loop's socket
    batch = [_submit(loop, f"k{i}") for i in range(3)]
    loop.run_batch(batch)
    assert [c.future.result()[0]["id"] for c in batch] == ["j1", "j2", "j3"]
