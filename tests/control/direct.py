"""Driving the control loop directly, without a server: a backend that does what it is told,
a wall clock moved by hand, and the commands an API handler would send."""

from __future__ import annotations

import time

from gpu_arbiter.backends.base import Placement, Running
from gpu_arbiter.control.auth import Principal
from gpu_arbiter.control.config import ServerConfig
from gpu_arbiter.control.jobrows import job_row
from gpu_arbiter.control.loop import ControlLoop
from gpu_arbiter.control.schemas import JobSubmit, NodeRegister, TeamPut
from gpu_arbiter.domain import JobStopped

ADMIN = Principal("admin", None, 0)


class Executor:
    """A backend that runs whatever it is told to until told to stop, and then stops it."""

    name = "fake"

    def __init__(self) -> None:
        self.jobs: dict[str, Placement] = {}
        self.events: list = []

    def start(self, placement: Placement) -> None:
        self.jobs[placement.job_id] = placement

    def stop(self, job_id: str, grace_s: float) -> None:
        if self.jobs.pop(job_id, None) is not None:
            self.events.append(JobStopped(job_id, time.time()))

    def poll(self) -> list:
        events, self.events = self.events, []
        return events

    def running(self) -> list[Running]:
        return [Running(j, list(p.gpus_by_node)) for j, p in self.jobs.items()]


class Clock:
    """A wall clock moved by hand, starting at the real time."""

    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


def advance(loop: ControlLoop, seconds: float) -> float:
    """Move the loop's wall clock ahead by hand; returns the new time."""
    return set_time(loop, loop.now() + seconds)


def set_time(loop: ControlLoop, t: float) -> float:
    """Set the loop's wall clock (e.g. a second loop, after a restart, to the first one's)."""
    assert isinstance(loop.clock, Clock)
    loop.clock.t = t
    return t


def new_loop(db, tmp_path, executor: Executor) -> ControlLoop:
    # No agent sends heartbeats here: the node must not be found silent when time jumps.
    cfg = ServerConfig(state_dir=tmp_path, accrue_s=60.0, heartbeat_timeout_s=1e9)
    loop = ControlLoop(db, executor, cfg, clock=Clock())  # type: ignore[arg-type]
    loop.load()
    return loop


def call(loop: ControlLoop, fn, *args):
    return loop.transaction(lambda tx: fn(tx, *args))


def tick(loop: ControlLoop) -> None:
    """A tick one second later (a cycle runs at most every `cycle_interval_s`)."""
    advance(loop, 1.0)
    loop.tick()


def row(loop: ControlLoop, job_id: str) -> dict:
    with loop.connection() as conn:
        return job_row(conn, job_id)


def submit(loop: ControlLoop, team: str, gpus: int, tier: int, **kw) -> str:
    req = JobSubmit(command="sleep 3600", gpus=gpus, tier=tier, team=team, **kw)
    row, _ = call(loop, loop.commands.submit, ADMIN, req, None, "h")
    return row["id"]


def setup(loop: ControlLoop, budgets: dict[str, float | None], quota: int = 0) -> None:
    """One 8-GPU node; team "a" with `quota` GPUs guaranteed, the others none."""
    call(loop, loop.commands.register_node, ADMIN, "n1", NodeRegister(gpu_type="H100", gpus=8))
    for team, budget in budgets.items():
        put = TeamPut(budget_per_period=budget, quota={"H100": quota} if team == "a" else {})
        call(loop, loop.commands.put_team, ADMIN, team, put)
    tick(loop)


def charges(loop: ControlLoop, job_id: str) -> list:
    return [e for e in loop.accounts.ledger.audit(job_id) if e.kind == "charge"]
