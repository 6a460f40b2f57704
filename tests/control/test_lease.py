"""One serve per state (issue 45 item 8): a second `arbiter serve` on the same state dir or
database refuses with one line naming the first and touches nothing; `--standby` waits."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
from sqlalchemy import text

from gpu_arbiter.control.launch import free_port
from gpu_arbiter.control.lease import InUse, Lease
from tests.control.harness import Cluster, database, start_server, wait_for


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path):
    yield from database(request.param, tmp_path)


def test_a_second_lease_on_the_same_state_dir_or_database_is_refused_naming_the_first(db, tmp_path):
    first = Lease(tmp_path / "state", db, "http://127.0.0.1:1111")
    first.acquire()
    try:
        for state in (tmp_path / "state", tmp_path / "other"):  # same dir; same database
            with pytest.raises(InUse, match=rf"pid {os.getpid()} on .*http://127.0.0.1:1111"):
                Lease(state, db, "http://127.0.0.1:2222").acquire()
        # A refused lease let go of what it had taken: the other state dir is free.
        free = Lease(tmp_path / "other", str(tmp_path / "b.db"), "x")
        free.acquire()
        free.release()
    finally:
        first.release()
    again = Lease(tmp_path / "other", db, "http://127.0.0.1:2222")
    again.acquire()
    again.release()


def test_a_standby_lease_waits_and_takes_over_when_the_holder_lets_go(db, tmp_path):
    first = Lease(tmp_path / "a", db, "http://127.0.0.1:1111")
    first.acquire()
    said: list[str] = []
    standby = Lease(tmp_path / "b", db, "http://127.0.0.1:2222")
    t = threading.Thread(
        target=lambda: standby.acquire(wait=True, every_s=0.05, waiting=said.append)
    )
    t.start()
    try:
        wait_for(lambda: said, timeout_s=120)
        assert t.is_alive() and "waiting to take over" in said[0]
    finally:
        first.release()
        t.join(timeout=30)
    assert not t.is_alive()
    standby.release()


def test_a_second_serve_refuses_in_one_line_and_leaves_the_first_and_its_files_alone(tmp_path):
    state = tmp_path / "state"
    server = start_server(str(tmp_path / "a.db"), state, "--min-grace", "1")
    c = Cluster(server)
    try:
        c.node("n1", 8)
        team = c.team("t", quota=8)
        job = team.post("/v1/jobs", json={"command": "sleep 600", "gpus": 2}).json()["id"]
        wait_for(lambda: c.job(job)["state"] == "running")
        token_file = state / "admin.token"
        token_file.write_text("the first serve's token\n")
        # Another database and port, the same state dir: it used to kill the first one's jobs.
        cmd = [sys.executable, "-m", "gpu_arbiter.cli", "serve", "--state-dir", str(state)]
        cmd += ["--db", str(tmp_path / "b.db"), "--port", str(free_port())]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert out.returncode == 2
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1, out.stderr
        assert f"pid {server.proc.pid}" in lines[0] and server.url in lines[0]
        assert token_file.read_text() == "the first serve's token\n"
        assert not (tmp_path / "b.db").exists()
        assert c.job(job)["state"] == "running"
        team.post(f"/v1/jobs/{job}/cancel")
    finally:
        c.close()
        server.close()


@pytest.fixture
def pg(tmp_path):
    yield from database("postgres", tmp_path)


def test_the_postgresql_leader_lock_is_on_a_connection_both_ends_give_up_on_within_seconds(
    pg, tmp_path
):
    """A leader cut off from the database must stop, and the server must let go of its lock,
    within seconds, not after TCP's default two hours of silence."""
    lease = Lease(tmp_path / "state", pg, "http://127.0.0.1:1111")
    lease.acquire()
    try:
        lock = lease.parts[-1][1]
        for name, want in (("tcp_keepalives_idle", "6"), ("tcp_keepalives_count", "3")):
            assert lock._conn.execute(text(f"SHOW {name}")).scalar() == want
        dsn = lock._conn.connection.driver_connection.info.dsn
        assert "tcp_user_timeout=5000" in dsn and "keepalives_idle=2" in dsn
    finally:
        lease.release()
