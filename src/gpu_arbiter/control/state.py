"""What the control loop knows between transactions (`LoopState`), and one transaction (`Tx`).

`LoopState` is the in-memory side of the database: the engine, the jobs that have not ended,
the nodes, the teams, the health and telemetry watchers, and the flags that tell the loop a
cycle or a rebuild is due. Only the loop's thread changes it; the commands, the application of
decisions and events, and the rebuild are handed it explicitly, so every part reads and changes
the same one and none owns a copy. A rebuild refills it in place.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Connection

from gpu_arbiter.control.jobrows import LiveJob
from gpu_arbiter.control.store import AUDIT, JOBS, insert_rows
from gpu_arbiter.control.watch import JobWatch
from gpu_arbiter.domain import Team
from gpu_arbiter.engine import Scheduler
from gpu_arbiter.reliability.health import HealthMonitor

log = logging.getLogger("gpu_arbiter.control")

# Who the audit log says made the changes the loop makes on its own.
SCHEDULER = "scheduler"
# Node states whose jobs run: a degraded node (its ranks held a gang back) takes no new work.
IN_SERVICE = ("up", "degraded")


@dataclass(slots=True)
class Tx:
    """One transaction of the loop: its connection and time, what to do once it commits (the
    backend's calls, webhooks), and new job and audit rows, buffered and written with one
    statement each (`flush`, `insert_rows`): compiling an INSERT per submission would cost more
    than the commit it shares with the rest of the batch."""

    conn: Connection
    now: float
    after: list[Callable[[], None]] = field(default_factory=list)
    new_jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    audit_rows: list[dict[str, Any]] = field(default_factory=list)

    def flush(self) -> None:
        if self.new_jobs:
            insert_rows(self.conn, JOBS, list(self.new_jobs.values()))
            self.new_jobs = {}
        if self.audit_rows:
            insert_rows(self.conn, AUDIT, self.audit_rows)
            self.audit_rows = []

    def audit(self, actor: str, action: str, subject: str, **detail: Any) -> None:
        """Record a state change in the audit log, and in the server's log at level info
        (every change but a submission, the one that comes in bursts of thousands)."""
        kept = {k: v for k, v in detail.items() if v is not None}
        self.audit_rows.append(
            {"at": self.now, "actor": actor, "action": action, "subject": subject, "detail": kept}
        )
        if action != "submit" and log.isEnabledFor(logging.INFO):
            said = ", ".join(f"{k}={v}" for k, v in kept.items())
            log.info("%s %s by %s%s", action, subject, actor, f" ({said})" if said else "")


@dataclass(slots=True)
class LoopState:
    """What the loop holds in memory; see the module docstring. `sched` is None while no node
    is registered."""

    monitor: HealthMonitor
    watch: JobWatch
    sched: Scheduler | None = None
    live: dict[str, LiveJob] = field(default_factory=dict)
    # (team, idempotency key) -> (the job it created, the hash of the request that did)
    keys: dict[tuple[str, str], tuple[str, str | None]] = field(default_factory=dict)
    teams: dict[str, Team] = field(default_factory=dict)
    run_as: dict[str, str] = field(default_factory=dict)  # team -> the unix user of its jobs
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> its row
    degraded: set[str] = field(default_factory=set)  # nodes marked degraded (or that were)
    next_seq: int = 1
    secret: bytes = b""
    changed: bool = True  # something changed since the last scheduling cycle
    rebuild: bool = False  # the engine must be built again (teams or nodes changed)
    # Draining (`Commands.drain`): no job starts; the server stops once none runs.
    draining: bool = False

    def job_token(self, job_id: str) -> str:
        """The token a job's SDK reports telemetry with: derived, so it is never stored."""
        return "job_" + hmac.new(self.secret, job_id.encode(), hashlib.sha256).hexdigest()
