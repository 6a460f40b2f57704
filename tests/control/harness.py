"""Real servers for tests: `arbiter serve` as a child process on a free loopback port, with a
fresh database — a SQLite file, or a PostgreSQL database created for the test when
ARBITER_TEST_POSTGRES_URL names a server (CI starts one)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from gpu_arbiter.control.launch import ServerProcess

ADMIN = "admin-test-token"
PG_ENV = "ARBITER_TEST_POSTGRES_URL"


class NoBackend:
    """A dispatch backend with nothing running and nothing to report, for driving the control
    loop directly in tests."""

    name = "none"

    def running(self) -> dict:
        return {}

    def poll(self) -> list:
        return []


def database(kind: str, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database of `kind` ("sqlite" or "postgres"), dropped afterwards."""
    if kind == "sqlite":
        yield str(tmp_path / "arbiter.db")
        return
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"PostgreSQL tests need {PG_ENV}=postgresql://user@host:port/db")
    import psycopg

    name = f"arbiter_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    root, _, _ = base.rpartition("/")
    try:
        yield f"{root}/{name}"
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def wait_for(
    what: Callable[[], object],
    timeout_s: float = 60.0,
    every_s: float = 0.2,
    explain: Callable[[], str] | None = None,
) -> object:
    """Poll until `what()` is truthy; its value, or a failure naming the timeout and, with
    `explain`, what it says about the state left behind."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = what()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f": {explain()}" if explain is not None else ""
            pytest.fail(f"condition not met within {timeout_s} s{detail}")
        time.sleep(every_s)


class Cluster:
    """A running server with an admin client and helpers to set up teams and nodes."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.admin = server.client()

    def node(self, name: str = "n1", gpus: int = 8, gpu_type: str = "H100") -> None:
        r = self.admin.put(f"/v1/nodes/{name}", json={"gpu_type": gpu_type, "gpus": gpus})
        assert r.status_code == 200, r.text

    def team(self, name: str, quota: int = 0, weight: float = 1.0) -> httpx.Client:
        """Create a team and return a client with a fresh token of it."""
        r = self.admin.put(f"/v1/teams/{name}", json={"weight": weight, "quota": {"H100": quota}})
        assert r.status_code == 200, r.text
        r = self.admin.post("/v1/tokens", json={"team": name})
        assert r.status_code == 201, r.text
        return self.server.client(r.json()["token"])

    def job(self, job_id: str) -> dict:
        r = self.admin.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()

    def close(self) -> None:
        self.admin.close()


def start_server(db: str, state_dir: Path, *extra: str) -> ServerProcess:
    """A server whose team jobs may run as root: the tests run as whoever runs them, root on
    CI, and their teams name no run_as user (test_isolation.py covers that)."""
    server = ServerProcess(db, state_dir, ADMIN, extra=("--allow-root-jobs", *extra))
    try:
        return server.start()
    except Exception:
        server.kill()
        raise
