"""The loop's state built from the database at a start, after a failed transaction, and when
teams or nodes change: teams, nodes, the engine, and every job that has not ended — pending
ones queued again, running ones adopted on their GPUs when the backend still runs them, or
recorded as the backend says they ended while the control plane was away (`reconcile.py`).

Separate from the loop because it is the one place that trusts the database over memory, and
from `apply` because it decides what became of jobs nobody watched.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.engine import Connection

from gpu_arbiter.backends.base import Backend
from gpu_arbiter.control.accounting import Accounts
from gpu_arbiter.control.apply import Applier
from gpu_arbiter.control.config import ServerConfig
from gpu_arbiter.control.jobrows import ACTIVE, allocation_of, live_job
from gpu_arbiter.control.reconcile import reconcile
from gpu_arbiter.control.state import IN_SERVICE, LoopState, Tx
from gpu_arbiter.control.store import JOBS, NODES, SETTINGS, TEAMS, TELEMETRY, setting
from gpu_arbiter.control.watch import JobWatch
from gpu_arbiter.domain import (
    Cluster,
    InvalidInput,
    JobFinished,
    Node,
    Rack,
    Team,
    Tier,
)
from gpu_arbiter.domain.events import JobFailed, JobLaunchFailed, JobLost
from gpu_arbiter.engine import EngineConfig, Scheduler
from gpu_arbiter.reliability.health import HealthMonitor, HealthReport

log = logging.getLogger("gpu_arbiter.control")


class Rebuild:
    """Fills the loop's state (`LoopState`, `Accounts`) from the database and the backend.
    `clock` is the loop's time, which the engine's budget rule reads."""

    def __init__(
        self,
        st: LoopState,
        accounts: Accounts,
        apply: Applier,
        backend: Backend,
        cfg: ServerConfig,
        clock: Callable[[], float],
    ) -> None:
        self.st = st
        self.accounts = accounts
        self.apply = apply
        self.backend = backend
        self.cfg = cfg
        self.clock = clock

    def load(self, tx: Tx) -> None:
        """Everything from the database: the job-token secret (made on a fresh one), the
        books, the idempotency keys, then the engine and its jobs (`build`)."""
        conn, st = tx.conn, self.st
        value = setting(conn, "secret")
        if value is None:
            value = {"hex": secrets.token_hex(32)}
            conn.execute(insert(SETTINGS).values(key="secret", value=value))
        st.secret = bytes.fromhex(value["hex"])
        self.accounts.load(conn, tx.now)
        st.next_seq = (conn.execute(select(func.max(JOBS.c.seq))).scalar() or 0) + 1
        st.keys = {
            (r.team, r.client_key): (r.id, r.request_hash)
            for r in conn.execute(
                select(JOBS.c.team, JOBS.c.client_key, JOBS.c.id, JOBS.c.request_hash).where(
                    JOBS.c.client_key.is_not(None)
                )
            )
        }
        self.build(tx)

    def build(self, tx: Tx) -> None:
        """The engine from the database: teams, nodes, then every job that has not ended —
        pending ones queued again, running ones adopted on their GPUs when the backend still
        runs them (reconciliation), else queued again."""
        conn, now, st, apply = tx.conn, tx.now, self.st, self.apply
        rows = conn.execute(select(TEAMS)).all()
        st.teams = {
            r.name: Team(r.name, r.weight, dict(r.quota), r.budget_per_period) for r in rows
        }
        st.run_as = {r.name: r.run_as for r in rows if r.run_as}
        self.accounts.set_teams(st.teams.values())
        st.watch = JobWatch(self.cfg.stragglers, self.cfg.breakers)
        for r in conn.execute(select(TEAMS.c.name, TEAMS.c.breaker_policy, TEAMS.c.webhook_url)):
            st.watch.set_team(r.name, r.breaker_policy, r.webhook_url)
        st.nodes = {r.name: dict(r._mapping) for r in conn.execute(select(NODES))}
        st.monitor = HealthMonitor(self.cfg.heartbeat_timeout_s)
        for name, n in st.nodes.items():
            st.monitor.heartbeat(name, now)
            if n["state"] != "up":
                st.monitor.report(name, now, HealthReport())
        st.sched = sched = self._new_engine()
        if sched is not None:
            for name, n in st.nodes.items():
                if n["state"] not in IN_SERVICE:
                    sched.node_down(name, now)
        rows = conn.execute(
            select(JOBS).where(JOBS.c.state.in_(ACTIVE)).order_by(JOBS.c.seq)
        ).mappings()
        st.live, self.accounts.segs = {}, {}
        running_rows = {}
        for row in rows:
            st.live[row["id"]] = live_job(row)
            if sched is not None and row["last_checkpoint_at"] is not None:
                sched.sdk_checkpoints.add(row["id"])
            if row["state"] == "running":
                running_rows[row["id"]] = row
                if row["seg_start"] is not None:
                    self.accounts.reopen(row["id"], row)
        plan = reconcile(running_rows, self.backend.running())
        for job_id in plan.orphans:
            tx.after.append(lambda j=job_id: self.backend.stop(j, 0.0))
        adopt = set(plan.adopt)
        for job_id, live in list(st.live.items()):
            row = running_rows.get(job_id)
            ended = None
            if row is not None and job_id not in adopt:
                ended = self._ended_while_away(row)
                forget = getattr(self.backend, "forget", None)
                if forget is not None:  # what it kept to answer may go once this commits
                    tx.after.append(lambda j=job_id, f=forget: f(j))
                if ended is not None and self._record_end(tx, job_id, ended, row):
                    continue
            if sched is None:
                if row is not None:
                    apply.requeue(tx, job_id, "no nodes are registered", stop=True)
                continue
            try:
                job = sched.resubmit(live.spec, live.submitted_at, Tier(live.tier))
            except InvalidInput as e:
                apply.end(tx, job_id, "failed", f"no longer fits the cluster: {e}", stop=True)
                continue
            if row is None:
                continue
            alloc = allocation_of(sched.cluster, row["allocation"])
            if job_id in adopt and alloc is not None:
                try:
                    sched.adopt(job, alloc, row["started_at"] or now)
                    continue
                except InvalidInput as e:
                    why = f"could not take it back after a restart: {e}"
            elif isinstance(ended, JobLost):
                apply.requeue(
                    tx,
                    job_id,
                    f"node failure while the control plane was down: {ended.reason}",
                    lost_from=apply.lost_from(job_id),
                    restart=True,
                    at=ended.at,
                )
                continue
            elif ended is not None:
                apply.requeue(tx, job_id, "stopped after preemption", at=ended.at)
                continue
            elif row["preempting"]:  # the backend still ends it at its deadline
                why = "its preemption was under way at a restart: queued again"
            else:
                why = (
                    f"its process was gone after a restart and {self.backend.name} does not "
                    "know how it ended: started again"
                )
            apply.requeue(tx, job_id, why, stop=job_id in adopt)
        if sched is not None:
            st.degraded = {name for name, n in st.nodes.items() if n["state"] == "degraded"}
            for name in st.degraded:
                sched.drain(name)
            self._replay_telemetry(conn)
        self._hold_spares()
        st.changed = True
        st.rebuild = False

    def _new_engine(self) -> Scheduler | None:
        nodes = self.st.nodes
        if not nodes:
            return None
        racks = sorted({n["rack"] for n in nodes.values()})
        cluster = Cluster.build(
            "live",
            [Node(n["name"], n["gpu_type"], n["gpus"], n["rack"]) for n in nodes.values()],
            [Rack(r) for r in racks],
        )
        config = EngineConfig(tier2_grace_s=self.cfg.tier2_grace_s, restart_overhead_s=0.0)
        return Scheduler(
            cluster, self.st.teams.values(), self.cfg.policy, config, budget=self._budget_rule
        )

    def _budget_rule(self, team: str, tier: Tier) -> Tier:
        return self.accounts.budgets.effective_tier(team, tier, self.clock())

    def _hold_spares(self) -> None:
        """Hold `hot_spares` nodes of each GPU type back for the jobs a node failure displaces
        (F2): the last healthy nodes with nothing on them, chosen again at every rebuild, so a
        spare that took a failed-over job is replaced by another empty node."""
        sched = self.st.sched
        if not self.cfg.hot_spares or sched is None:
            return
        index = sched.index
        held: dict[str, int] = {}
        names: list[str] = []
        for node in reversed(sched.cluster.nodes):
            i, t = node.index, node.gpu_type
            empty = index.free_mask[i] == (1 << node.gpus) - 1
            if empty and not index.down[i] and held.get(t, 0) < self.cfg.hot_spares:
                held[t] = held.get(t, 0) + 1
                names.append(node.name)
        sched.reserve_spares(names)

    def _ended_while_away(self, row: Mapping[str, Any]) -> Any:
        """How a job the database has running, and the backend no longer runs, ended — the
        backend's answer (an event at the job's real end), or None when its fate is unknown
        (it never started, or the executor has forgotten it). The backend is told when the
        server last knew the job running (the end of its last accrual, its last report): an
        end only the job vouches for is never put before it."""
        ask = getattr(self.backend, "outcome", None)
        if ask is None or row["started_at"] is None:
            return None
        seg = self.accounts.segs.get(row["id"])
        known = [row["started_at"], (row["telemetry"] or {}).get("at")]
        alive_at = max([t for t in known if t is not None] + ([seg.billed_to] if seg else []))
        try:
            return ask(row["id"], row["started_at"], alive_at)
        except Exception:
            log.exception("job %s: asking %s how it ended failed", row["id"], self.backend.name)
            return None

    def _record_end(self, tx: Tx, job_id: str, ended: Any, row: Mapping[str, Any]) -> bool:
        """Record a job that ended while the control plane was away at its real end, charged
        up to then; False when the end puts it back in the queue instead (a node failure, or
        an exit on a preemption's notice)."""
        actor = self.backend.name
        if isinstance(ended, JobFinished):
            self.apply.end(tx, job_id, "completed", "", exit_code=0, actor=actor, at=ended.at)
        elif isinstance(ended, JobLaunchFailed):
            self.apply.never_ran(tx, job_id, ended.reason, actor)
        elif isinstance(ended, JobFailed) and not row["preempting"]:
            why = f"exited with code {ended.exit_code}"
            code = ended.exit_code
            self.apply.end(tx, job_id, "failed", why, exit_code=code, actor=actor, at=ended.at)
        else:
            return False
        return True

    def _replay_telemetry(self, conn: Connection) -> None:
        """Rebuild the breaker and straggler state of running jobs from their stored reports
        of the current run (`watch.JobWatch.replay`)."""
        assert self.st.sched is not None
        for job_id, job in self.st.sched.running.items():
            rows = conn.execute(
                select(TELEMETRY.c.at, TELEMETRY.c.data)
                .where(TELEMETRY.c.job_id == job_id, TELEMETRY.c.at >= job.started_at)
                .order_by(TELEMETRY.c.id)
            )
            self.st.watch.replay(job_id, job.team, ((r.at, r.data) for r in rows))
