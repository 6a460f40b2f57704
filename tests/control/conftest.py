"""Fixtures that start real servers; every test runs against SQLite and PostgreSQL.

`live` is one server per test module (starting a server takes seconds), so tests that share it
create their own teams and never depend on each other's jobs.
"""

from __future__ import annotations

import pytest

from tests.control.harness import Cluster, database, start_server


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def db(request, tmp_path_factory):
    yield from database(request.param, tmp_path_factory.mktemp("db"))


@pytest.fixture(scope="module")
def live(db, tmp_path_factory):
    """A server with one 8-GPU H100 node, always stopped after the module."""
    server = start_server(db, tmp_path_factory.mktemp("state"), "--min-grace", "1")
    c = Cluster(server)
    try:
        c.node("n1", 8)
        yield c
    finally:
        c.close()
        server.close()
