"""kill -9 of the server in the middle of a burst of submissions loses nothing acknowledged,
and after the restart running jobs are reconciled with the backend and the ledger balances."""

from __future__ import annotations

import threading
from collections import Counter
from itertools import pairwise

import httpx
import pytest

from tests.control.harness import Cluster, database, start_server, wait_for


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path):
    yield from database(request.param, tmp_path)


def burst(
    url: str, token: str, acked: list[str], keys: list[str], stop: threading.Event, worker: int
) -> None:
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10
    ) as client:
        n = 0
        while not stop.is_set():
            key = f"w{worker}-{n}"
            n += 1
            keys.append(key)
            try:
                r = client.post(
                    "/v1/jobs",
                    json={"command": "true", "gpus": 1},
                    headers={"Idempotency-Key": key},
                )
            except httpx.HTTPError:
                return  # the server is gone
            if r.status_code == 201:
                acked.append(r.json()["id"])


def test_kill_9_during_a_burst_loses_no_acknowledged_job(db, tmp_path):
    state = tmp_path / "state"
    server = start_server(db, state, "--min-grace", "1")
    c = Cluster(server)
    try:
        c.node("n1", 8)
        team = c.team("burst", quota=4)
        token = team.headers["Authorization"].split()[1]
        long_id = team.post("/v1/jobs", json={"command": "sleep 6", "gpus": 2}).json()["id"]
        wait_for(lambda: c.job(long_id)["state"] == "running")
        acked: list[str] = []
        keys: list[str] = []
        stop = threading.Event()
        workers = [
            threading.Thread(target=burst, args=(server.url, token, acked, keys, stop, i))
            for i in range(4)
        ]
        for w in workers:
            w.start()
        wait_for(lambda: len(acked) >= 100, timeout_s=60, every_s=0.01)
        server.kill()
        stop.set()
        for w in workers:
            w.join(timeout=30)
        c.close()

        server = start_server(db, state, "--min-grace", "1")
        c = Cluster(server)
        team = server.client(token)
        jobs = {j["id"]: j for j in c.admin.get("/v1/jobs", params={"limit": 10000}).json()}
        assert set(acked) <= set(jobs)
        # Resending every request with its key creates no duplicate of a committed one.
        for key in keys:
            r = team.post(
                "/v1/jobs", json={"command": "true", "gpus": 1}, headers={"Idempotency-Key": key}
            )
            assert r.status_code in (200, 201)
        jobs = c.admin.get("/v1/jobs", params={"limit": 10000}).json()
        assert len(jobs) == len(keys) + 1
        # The long job kept running through the crash: adopted, not restarted.
        survivor = c.job(long_id)
        assert survivor["state"] in ("running", "completed")
        assert survivor["restarts"] == 0 and survivor["preemptions"] == 0

        def all_jobs() -> list[dict]:
            return c.admin.get("/v1/jobs", params={"limit": 10000}).json()

        def unfinished() -> str:
            left = [j for j in all_jobs() if j["state"] != "completed"]
            states = Counter(j["state"] for j in left)
            sample = ", ".join(f"{j['id']} {j['state']}" for j in left[:5])
            return f"{len(left)} not completed ({dict(states)}), e.g. {sample}"

        wait_for(
            lambda: all(j["state"] == "completed" for j in all_jobs()),
            timeout_s=240,
            every_s=0.5,
            explain=unfinished,
        )
        ledger = c.admin.get("/v1/ledger", params={"limit": 100000}).json()
        assert [e["seq"] for e in ledger] == list(range(len(ledger)))
        assert sum(p[1] for e in ledger for p in e["postings"]) == 0
        charged = {e["job_id"] for e in ledger if e["kind"] == "charge"}
        assert long_id in charged
        # Charged once for each second it ran, and for none past its real end: running jobs
        # accrue every minute (a slow restart may post one such charge before the end is
        # known), and what accrued past the end is refunded.
        mine = [e for e in ledger if e["job_id"] == long_id]
        spans = sorted((e["start"], e["end"]) for e in mine if e["kind"] == "charge")
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in pairwise(spans))
        net = sum(
            (1 if e["kind"] == "charge" else -1) * e["gpu_seconds"]
            for e in mine
            if e.get("gpu_seconds") is not None
        )
        done = c.job(long_id)
        assert net == pytest.approx(2 * (done["finished_at"] - done["started_at"]), abs=1e-6)
    finally:
        c.close()
        server.close()
