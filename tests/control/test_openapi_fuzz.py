"""Schemathesis over every operation of /openapi.json against a real server: no answer is a 5xx
and every answer (status, content type, body) is one the published schema documents.

Every check runs but one: a request the schema allows may still be refused 422 by a rule of
the service (a job larger than the cluster, an unknown GPU type, quotas promising more than
there is), which the schema documents as "a refused request".

Kept to a bounded number of examples per operation so the pass takes about a minute. The
server allows no root jobs and its team runs as `nobody`, so the random commands this submits
never run as root (as any other user they are refused or run as nobody).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.control.harness import ADMIN, Cluster, NoBackend, database, wait_for

EXAMPLES = 15


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    from gpu_arbiter.control.launch import ServerProcess

    root = tmp_path_factory.mktemp("fuzz")
    db = next(database("sqlite", root))
    server = ServerProcess(
        db,
        root / "state",
        ADMIN,
        extra=["--min-grace", "1", "--auth-failures-per-minute", "100000"],
    )
    server.start()
    c = Cluster(server)
    try:
        c.node("n1", 8)
        run_as = "nobody" if os.geteuid() == 0 and shutil.which("setpriv") else None
        r = c.admin.put("/v1/teams/fuzz", json={"quota": {"H100": 2}, "run_as": run_as})
        assert r.status_code == 200, r.text
        job = c.admin.post("/v1/jobs", json={"command": "sleep 300", "team": "fuzz"}).json()
        wait_for(lambda: c.job(job["id"])["state"] in ("running", "failed"))
        yield c
    finally:
        c.close()
        server.stop()
        server.kill()


def published_schema() -> dict:
    """The schema the server publishes, from the same app code without starting it (the
    cases are generated at collection, before any server runs)."""
    from gpu_arbiter.control.config import ServerConfig
    from gpu_arbiter.control.service import build_service
    from gpu_arbiter.server import create_app

    config = ServerConfig(state_dir=Path("/nonexistent/arbiter-state"))
    service = build_service("sqlite:///:memory:", config, backend=NoBackend())  # type: ignore[arg-type]
    try:
        return create_app(service).openapi()
    finally:
        service.db.dispose()


schema = schemathesis.openapi.from_dict(published_schema())


def test_the_published_schema_is_the_one_served(fuzz_server):
    served = httpx.get(f"{fuzz_server.server.url}/openapi.json").json()
    assert served == published_schema()


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_every_operation_answers_as_documented_and_never_5xx(case, fuzz_server):
    if case.path_parameters and case.path_parameters.get("token_id") == 1:
        return  # revoking the admin token (id 1) would leave the rest of the pass unauthorised
    if case.path == "/v1/drain":
        return  # a drain stops the server for good (test_drain.py covers it)
    case.call_and_validate(
        base_url=fuzz_server.server.url,
        headers={"Authorization": f"Bearer {ADMIN}"},
        excluded_checks=[positive_data_acceptance],
    )
