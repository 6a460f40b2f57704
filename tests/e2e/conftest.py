"""End-to-end tests run against SQLite and PostgreSQL, like the API tests."""

from __future__ import annotations

import pytest

from tests.control.harness import database


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path):
    yield from database(request.param, tmp_path)
