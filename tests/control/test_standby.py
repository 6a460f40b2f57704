"""A standby control plane on PostgreSQL (issue 46 item 4): `arbiter serve --standby` waits
while a leader holds the database; kill -9 the leader during a burst of keyed submissions and
the standby takes over, adopts the running job without restarting it, and every acknowledged
submission exists exactly once. Clients and the agent given both URLs move to the new leader."""

from __future__ import annotations

import json
import threading
import time

import pytest

from gpu_arbiter.agent import Agent, discover
from gpu_arbiter.cli.client import api
from gpu_arbiter.control.launch import ServerProcess, start_agent
from gpu_arbiter.domain import ArbiterError
from tests.control.harness import ADMIN, Cluster, database, start_server, wait_for
from tests.failover import dead_then_live


@pytest.fixture
def pg(tmp_path):
    yield from database("postgres", tmp_path)


def burst(urls: str, token: str, acked: list[str], keys: list[str], stop: threading.Event, n: int):
    """Keyed submissions through the CLI's client, which moves along the URL list."""
    i = 0
    while not stop.is_set():
        key = f"w{n}-{i}"
        i += 1
        keys.append(key)
        body = {"command": "true", "gpus": 1}
        try:
            job = api(urls, token, "POST", "/v1/jobs", json=body, headers={"Idempotency-Key": key})
        except ArbiterError:
            time.sleep(0.1)  # not acknowledged: the leader died under it, or none leads yet
            continue
        acked.append(job["id"])


def test_a_standby_takes_over_from_a_killed_leader_adopting_jobs_and_losing_no_submission(
    pg, tmp_path
):
    state = tmp_path / "state"
    leader = start_server(pg, state, "--min-grace", "1")
    standby = ServerProcess(
        pg,
        state,
        ADMIN,
        extra=["--min-grace", "1", "--standby", "--allow-root-jobs"],
        log_path=tmp_path / "b.log",
    )
    urls = f"{leader.url},{standby.url}"
    c = Cluster(leader)
    agent = None
    stop = threading.Event()
    workers: list[threading.Thread] = []
    try:
        agent = start_agent(urls, ADMIN, "n1", 8, "H100", interval_s=1.0)
        wait_for(lambda: c.admin.get("/v1/nodes").json())
        team = c.team("burst", quota=8)
        token = team.headers["Authorization"].split()[1]
        long_id = team.post("/v1/jobs", json={"command": "sleep 600", "gpus": 2}).json()["id"]
        wait_for(lambda: c.job(long_id)["state"] == "running")
        pid = json.loads((state / "jobs" / f"{long_id}.json").read_text())["pid"]

        standby.start(ready=False)
        wait_for(lambda: "waiting to take over" in standby.log(), timeout_s=120)
        assert standby.proc is not None and standby.proc.poll() is None

        acked: list[str] = []
        keys: list[str] = []
        workers = [
            threading.Thread(target=burst, args=(urls, token, acked, keys, stop, i))
            for i in range(4)
        ]
        for w in workers:
            w.start()
        wait_for(lambda: len(acked) >= 100, timeout_s=180, every_s=0.01)
        leader.kill()
        killed_at, before = time.monotonic(), len(acked)
        wait_for(lambda: len(acked) > before, timeout_s=180, every_s=0.01)
        print(f"takeover: first acknowledgement {time.monotonic() - killed_at:.1f} s after kill -9")
        wait_for(lambda: len(acked) >= before + 50, timeout_s=180, every_s=0.05)
        stop.set()
        for w in workers:
            w.join(timeout=60)

        c.close()
        c = Cluster(standby)
        jobs = c.admin.get("/v1/jobs", params={"limit": 10000}).json()
        assert set(acked) <= {j["id"] for j in jobs}
        for key in keys:  # resent with its key, nothing committed is created twice
            api(standby.url, token, "POST", "/v1/jobs", json={"command": "true", "gpus": 1},
                headers={"Idempotency-Key": key})  # fmt: skip
        jobs = c.admin.get("/v1/jobs", params={"limit": 10000}).json()
        assert len(jobs) == len(keys) + 1
        assert len({j["client_key"] for j in jobs}) == len(jobs)
        # The running job was adopted where it ran, not started again.
        survivor = c.job(long_id)
        assert survivor["state"] == "running"
        assert survivor["restarts"] == 0 and survivor["preemptions"] == 0
        assert json.loads((state / "jobs" / f"{long_id}.json").read_text())["pid"] == pid
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=60)
        c.close()
        if agent is not None:
            agent.terminate()
            agent.wait(timeout=30)
        standby.close()
        leader.close()


def test_a_leader_that_loses_its_database_session_stops_at_once(pg, tmp_path):
    """Once PostgreSQL has ended the session that holds the leader lock, a standby may lead:
    the old leader must not schedule a moment longer."""
    import psycopg

    server = start_server(pg, tmp_path / "state")
    try:
        with psycopg.connect(pg, autocommit=True) as conn:
            ended = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchall()
        assert ended == [(True,)]
        assert server.proc is not None and server.proc.wait(timeout=60) == 75
        assert "lost the database session that held the leader lock" in server.log()
    finally:
        server.close()


def test_an_agent_given_several_urls_moves_to_the_one_that_answers():
    with dead_then_live() as servers:
        agent = Agent(servers.urls, "t", "n1", discover(8, "H100"))
        agent.register()
        agent.beat()
        assert [p for _, p, _ in servers.got] == ["/v1/nodes/n1", "/v1/nodes/n1/heartbeat"]
        assert agent.urls[0].endswith(f":{servers.live_port}")  # it stays with that one
