"""`arbiter drain`: stop the service for good (issue 45 item 9). Every running job gets its
notice and goes back to the queue, nothing new starts or is accepted, and `serve` exits once no
job runs, leaving no process behind; the queue waits in the database for the next start."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpu_arbiter.backends.local import kill_leftovers
from gpu_arbiter.control.errors import Unavailable
from gpu_arbiter.control.schemas import JobSubmit
from gpu_arbiter.control.store import open_database
from gpu_arbiter.domain import JobStopped
from tests.control.direct import ADMIN, Executor, call, new_loop, row, setup, submit, tick
from tests.control.harness import ADMIN as ADMIN_TOKEN
from tests.control.harness import Cluster, start_server, wait_for


def test_a_draining_loop_stops_its_jobs_with_notice_refuses_new_ones_and_says_when_done(
    tmp_path,
):
    db = open_database(str(tmp_path / "a.db"))
    executor = Executor()
    loop = new_loop(db, tmp_path, executor)
    setup(loop, {"a": None})
    core, low = submit(loop, "a", gpus=4, tier=2), submit(loop, "a", gpus=4, tier=3)
    waiting = submit(loop, "a", gpus=8, tier=3)
    tick(loop)
    assert set(executor.jobs) == {core, low}
    stops: list[tuple[str, float]] = []
    executor.stop = lambda j, g: stops.append((j, g))  # type: ignore[method-assign]
    done: list[bool] = []
    loop.on_drained = lambda: done.append(True)

    out = call(loop, loop.commands.drain, ADMIN, None)
    assert sorted(out["stopping"]) == sorted([core, low])
    assert dict(stops) == {core: 7200.0, low: loop.state.sched.notice_of_tier(3)}  # their notices
    with pytest.raises(Unavailable, match="draining"):
        call(loop, loop.commands.submit, ADMIN, JobSubmit(command="x", team="a"), None, "h")
    tick(loop)
    assert not done and row(loop, waiting)["state"] == "pending"  # nothing starts meanwhile
    executor.events += [JobStopped(core, 0.0), JobStopped(low, 0.0)]
    tick(loop)
    assert done == [True]
    assert {row(loop, j)["state"] for j in (core, low, waiting)} == {"pending"}
    assert row(loop, core)["reason"] == "stopped: the server was drained"
    db.dispose()


def test_arbiter_drain_stops_every_job_and_the_server_exits_leaving_no_process(tmp_path):
    db, state = str(tmp_path / "a.db"), tmp_path / "state"
    server = start_server(db, state, "--min-grace", "5")
    c = Cluster(server)
    noticed = tmp_path / "noticed"
    try:
        c.node("n1", 8)
        team = c.team("t", quota=8)
        trap = f"trap 'touch {noticed}; exit 0' TERM; sleep 600 & wait"
        jobs = [
            team.post("/v1/jobs", json={"command": cmd, "gpus": 4, "tier": 3}).json()["id"]
            for cmd in (trap, "sleep 600")
        ]
        wait_for(lambda: all(c.job(j)["state"] == "running" for j in jobs))
        env = {**os.environ, "ARBITER_URL": server.url, "ARBITER_TOKEN": ADMIN_TOKEN}
        out = subprocess.run(
            [sys.executable, "-m", "gpu_arbiter.cli", "drain", "--grace", "2"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "Draining: 2 job(s) stopping" in out.stdout
        assert server.proc is not None and server.proc.wait(timeout=120) == 0
        assert noticed.exists()  # the job got its notice (SIGTERM) before it was stopped
        assert kill_leftovers(state / "jobs") == []  # no job outlived the server
        c.close()

        server = start_server(db, state, "--min-grace", "1")
        c = Cluster(server)
        c.node("n1", 8)  # the queue waited in the database and runs again
        wait_for(lambda: all(c.job(j)["state"] == "running" for j in jobs))
    finally:
        c.close()
        server.close()
