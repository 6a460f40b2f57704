"""The control loop: the one thread that owns the engine, the ledger and every database write.

API handlers never change state themselves: they hand the loop a command and wait for its
answer. The loop takes every command that is waiting (up to `max_batch`), applies them in one
transaction and commits before answering any of them — group commit, so one fsync acknowledges
a whole burst of submissions while each acknowledged one is on disk. Each command validates
fully before it changes anything, so a refused command leaves no trace in the batch.

Between batches the loop polls the backend, checks node health, and runs a scheduling cycle of
the same engine the simulator uses, on the wall clock, whenever something changed (at most
every `cycle_interval_s`), when the policy asked to be woken, or every `idle_cycle_s`. The
decisions are written to the database first and carried out on the backend after the commit,
so a crash in between is repaired by reconciliation on restart (`reconcile.py`).

If a transaction fails unexpectedly, the in-memory state may no longer match the database:
the loop throws it away and rebuilds everything from the database and the backend.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import hmac
import json
import logging
import math
import queue
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection, Engine

from gpu_arbiter.backends.base import Backend, Placement
from gpu_arbiter.control.auth import Authenticator, Forbidden, Principal, hash_token, new_token
from gpu_arbiter.control.errors import Conflict, NotFound, Unavailable
from gpu_arbiter.control.metrics import Metrics
from gpu_arbiter.control.notify import Webhooks
from gpu_arbiter.control.reconcile import reconcile
from gpu_arbiter.control.schemas import Heartbeat, JobSubmit, NodeRegister, TeamPut, Telemetry
from gpu_arbiter.control.store import TABLES, dropped, insert_rows
from gpu_arbiter.control.watch import JobWatch
from gpu_arbiter.domain import (
    GPU_CATALOG,
    Allocation,
    ArbiterError,
    Cluster,
    InvalidInput,
    JobFinished,
    JobKind,
    JobSpec,
    JobStopped,
    Node,
    Preempt,
    Rack,
    Resize,
    Start,
    Team,
    Tier,
)
from gpu_arbiter.domain.events import (
    JobFailed,
    JobLaunchFailed,
    JobLost,
    JobPlaced,
    NodeDown,
    NodeUp,
)
from gpu_arbiter.domain.team import check_quotas
from gpu_arbiter.economy import (
    CHARGE,
    FAILURE_ABSORBED,
    RUN,
    Budgets,
    ChargeModel,
    Entry,
    Ledger,
    PriceTable,
    is_preemptible,
)
from gpu_arbiter.economy.chargeback import LOST_WORK, RERUN
from gpu_arbiter.engine import EngineConfig, Scheduler
from gpu_arbiter.reliability import Action, BreakerConfig, Trip, gpu_s_saved_by_stop
from gpu_arbiter.reliability.health import HealthMonitor, HealthReport
from gpu_arbiter.reliability.stragglers import Straggler, StragglerConfig

log = logging.getLogger("gpu_arbiter.control")

JOBS, TEAMS, NODES, TOKENS = TABLES["jobs"], TABLES["teams"], TABLES["nodes"], TABLES["tokens"]
LEDGER, AUDIT, TELEMETRY, SETTINGS = (
    TABLES["ledger"],
    TABLES["audit"],
    TABLES["telemetry"],
    TABLES["settings"],
)
ACTIVE = ("pending", "running")
# Node states whose jobs run: a degraded node (its ranks held a gang back) takes no new work.
IN_SERVICE = ("up", "degraded")
# A live job's real length is unknown until it exits; the engine needs a finite amount of work,
# so it gets one that only matters for backfill when the user gave no walltime.
LIVE_WORK_S = 7 * 86_400.0
SCHEDULER = "scheduler"


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The server's settings. `state_dir` is the server's own (logs, process state, the admin
    token; mode 0700); the jobs work under `work_root`, outside it."""

    state_dir: Path
    public_url: str = "http://127.0.0.1:8080"
    policy: str = "arbiter"
    tier2_grace_s: float = 7200.0
    heartbeat_timeout_s: float = 30.0
    cycle_interval_s: float = 0.2
    hot_spares: int = 0  # per GPU type (F2)
    idle_cycle_s: float = 5.0
    tick_s: float = 0.25
    max_batch: int = 512
    # Running jobs are charged for the seconds they held their GPUs at least this often (E5).
    accrue_s: float = 60.0
    stragglers: StragglerConfig = field(default_factory=StragglerConfig)
    breakers: BreakerConfig = field(default_factory=BreakerConfig)  # every team's thresholds
    public_metrics: bool = False  # per-team series on /metrics without a token
    jobs_root: Path | None = None  # jobs' working directories (default: `work_root`)
    allow_root_jobs: bool = False  # team jobs may run as root (local and Slurm refuse else)
    max_auth_failures_per_minute: int = 30  # per client address, then 429

    @property
    def work_root(self) -> Path:
        """Where each job gets its working directory: `jobs_root`, else `<state_dir>-work`
        beside the state directory (outside it, and one per server)."""
        if self.jobs_root is not None:
            return self.jobs_root
        return self.state_dir.with_name(self.state_dir.name + "-work")


@dataclass(slots=True)
class _Segment:
    """The run segment a job is in: what it holds since when, and up to when it was charged
    while it ran (`billed_to`, from the ledger after a restart)."""

    start: float
    gpu_type: str
    gpus: int
    tier: int
    borrowed: bool
    billed_to: float


@dataclass(slots=True)
class _Live:
    """What the loop keeps of a job that has not ended."""

    seq: int
    spec: JobSpec
    command: str
    env: dict[str, str]
    submitted_at: float
    tier: int
    last_checkpoint_at: float | None = None


@dataclass(slots=True)
class _Tx:
    """One transaction of the loop. New job rows and audit rows are buffered and written with
    one statement each (`flush`, `insert_rows`): compiling an INSERT per submission would cost
    more than the commit it shares with the rest of the batch."""

    conn: Connection
    now: float
    after: list[Callable[[], None]] = field(default_factory=list)
    new_jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    audit: list[dict[str, Any]] = field(default_factory=list)

    def flush(self) -> None:
        if self.new_jobs:
            insert_rows(self.conn, JOBS, list(self.new_jobs.values()))
            self.new_jobs = {}
        if self.audit:
            insert_rows(self.conn, AUDIT, self.audit)
            self.audit = []


@dataclass(slots=True)
class _Command:
    fn: Callable[..., Any]
    args: tuple
    future: Future


_STOP = object()


class ControlLoop:
    def __init__(
        self,
        db: Engine,
        backend: Backend,
        config: ServerConfig,
        auth: Authenticator | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.db = db
        self._conn: Connection | None = None
        self.backend = backend
        self.cfg = config
        self.auth = auth
        self.metrics = metrics or Metrics()
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._last_now = 0.0
        self.sched: Scheduler | None = None
        self.live: dict[str, _Live] = {}
        self.segs: dict[str, _Segment] = {}
        self.keys: dict[tuple[str, str], tuple[str, str | None]] = {}
        self.teams: dict[str, Team] = {}
        self.run_as: dict[str, str] = {}  # team -> the unix user its jobs run as
        self.nodes: dict[str, dict[str, Any]] = {}
        self.ledger = Ledger()
        self._persisted = 0
        self.spent: dict[str, float] = {}
        self.charges = ChargeModel()
        self.budgets = Budgets(self.ledger, {})
        self.monitor = HealthMonitor(config.heartbeat_timeout_s)
        self.next_seq = 1
        self._secret = b""
        self._changed = True
        self._rebuild = False
        self._last_cycle = 0.0
        self._last_tick = 0.0
        self._last_observed = 0.0
        self._last_accrual = 0.0
        self._last_budget_check = 0.0
        # Draining (`cmd_drain`): no job starts; once none runs, `on_drained` is called once.
        self.draining = False
        self.on_drained: Callable[[], None] | None = None
        self._wakeup = math.inf
        self.last_cycle_result: Any = None
        self.burn: dict[str, float] = {}
        # Starts the backend refused after their commit, handled on the next tick.
        self._launch_failures: list[JobLaunchFailed] = []
        self.watch = JobWatch(config.stragglers, config.breakers)
        self.webhooks = Webhooks(self.metrics.webhooks)
        self._degraded: set[str] = set()  # nodes marked degraded (or that were: see its use)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._load()
        # The cluster's capacity index and the state just loaded live as long as the process:
        # frozen, they are left out of the collector's full passes, which on a 100k-GPU
        # cluster would stall a scheduling cycle for tens of milliseconds each time.
        gc.collect()
        gc.freeze()
        self.webhooks.start()
        self._thread = threading.Thread(target=self._run, name="arbiter-control", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._inbox.put(_STOP)
        self._thread.join(timeout=30)
        self._thread = None
        self.webhooks.stop()
        gc.unfreeze()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- how the API talks to the loop -----------------------------------------------------

    def call(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run `fn(tx, *args)` on the loop in the next batch; the future resolves after the
        commit (or with the command's error)."""
        fut: Future = Future()
        self._inbox.put(_Command(fn, args, fut))
        return fut

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.wrap_future(self.call(fn, *args))

    def job_token(self, job_id: str) -> str:
        """The token a job's SDK reports telemetry with: derived, so it is never stored."""
        return "job_" + hmac.new(self._secret, job_id.encode(), hashlib.sha256).hexdigest()

    def check_job_token(self, job_id: str, token: str) -> bool:
        return hmac.compare_digest(self.job_token(job_id), token)

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            batch: list[_Command] = []
            stop = False
            try:
                item = self._inbox.get(timeout=self._timeout())
                while True:
                    if item is _STOP:
                        stop = True
                    else:
                        batch.append(item)
                    if len(batch) >= self.cfg.max_batch:
                        break
                    item = self._inbox.get_nowait()
            except queue.Empty:
                pass
            if batch:
                self._commands(batch)
            if stop or time.time() >= self._next_tick():
                try:
                    self._transaction(self._tick)
                except Exception:
                    log.exception("control loop tick failed; state was rebuilt from the database")
                self._last_tick = time.time()
            if stop:
                return

    def _next_tick(self) -> float:
        """When the tick is due: every `tick_s`, sooner when a change awaits its cycle (there
        are nodes to run one on) and at once when the engine must be rebuilt. Not after every
        batch: under a stream of submissions that was a second transaction, a backend poll and
        a health check per commit, more CPU than the submissions themselves."""
        if self._rebuild:
            return 0.0
        due = self._last_tick + self.cfg.tick_s
        if self._changed and self.sched is not None:
            due = min(due, self._last_cycle + self.cfg.cycle_interval_s)
        return due

    def _timeout(self) -> float:
        return min(self.cfg.tick_s, max(0.0, self._next_tick() - time.time()))

    def _now(self) -> float:
        self._last_now = max(self._last_now, time.time())
        return self._last_now

    def _transaction(self, work: Callable[[_Tx], Any]) -> Any:
        tx = None
        try:
            with self._begin() as conn:
                tx = _Tx(conn, self._now())
                out = work(tx)
                tx.flush()
                self._flush_ledger(tx)
        except Exception:
            self._reload()
            raise
        for action in tx.after:
            try:
                action()
            except Exception:
                log.exception("backend action failed")
        return out

    @contextmanager
    def _begin(self) -> Iterator[Connection]:
        """A transaction on the loop's own connection, kept from one transaction to the next:
        taking one from the pool for each batch cost a round trip to PostgreSQL per batch (the
        pool's liveness ping). One the database has dropped is replaced before it is used."""
        if self._conn is None:
            self._conn = self.db.connect()
        elif dropped(self._conn):
            self._conn.invalidate()  # the next use takes a new one from the pool
        with self._conn.begin():
            yield self._conn

    def _commands(self, batch: list[_Command]) -> None:
        """Run a batch of commands in one transaction. Should it fail (a bug, a database
        error), the state has been rebuilt from the database and each command is run again in
        a transaction of its own, so a bad command fails alone, never its neighbours."""

        def work(tx: _Tx) -> list[Any]:
            results: list[Any] = []
            for cmd in batch:
                if cmd.fn != self.cmd_submit:
                    tx.flush()  # the command may read or change rows submitted before it
                try:
                    results.append(cmd.fn(tx, *cmd.args))
                except ArbiterError as e:
                    results.append(e)
            return results

        try:
            results = self._transaction(work)
        except Exception as e:
            if len(batch) > 1:
                log.warning(
                    "a batch of %d requests failed (%s); running them one by one", len(batch), e
                )
                for cmd in batch:
                    self._commands([cmd])
                return
            log.exception("a request failed")
            batch[0].future.set_exception(e)
            return
        self.metrics.batch.observe(len(batch))
        for cmd, res in zip(batch, results, strict=True):
            if isinstance(res, ArbiterError):
                cmd.future.set_exception(res)
            else:
                cmd.future.set_result(res)

    # -- loading and rebuilding ------------------------------------------------------------

    def _reload(self) -> None:
        try:
            self._load()
        except Exception:
            log.exception("rebuilding from the database failed")

    def _load(self) -> None:
        """(Re)build all in-memory state from the database, then reconcile with the backend."""
        with self._begin() as conn:
            tx = _Tx(conn, self._now())
            secret = conn.execute(select(SETTINGS.c.value).where(SETTINGS.c.key == "secret"))
            row = secret.first()
            if row is None:
                value = {"hex": secrets.token_hex(32)}
                conn.execute(insert(SETTINGS).values(key="secret", value=value))
            else:
                value = row.value
            self._secret = bytes.fromhex(value["hex"])
            prices = conn.execute(
                select(SETTINGS.c.value).where(SETTINGS.c.key == "prices")
            ).first()
            table = PriceTable.from_dict(prices.value) if prices else PriceTable()
            self.charges = ChargeModel(table)
            rows = conn.execute(select(LEDGER.c.entry).order_by(LEDGER.c.seq)).all()
            self.ledger = Ledger.from_lines(json.dumps(r.entry) for r in rows)
            self._persisted = len(self.ledger)
            self.spent = {}
            for e in self.ledger.entries():
                self._count_spend(e)
            self.next_seq = (conn.execute(select(func.max(JOBS.c.seq))).scalar() or 0) + 1
            self.keys = {
                (r.team, r.client_key): (r.id, r.request_hash)
                for r in conn.execute(
                    select(JOBS.c.team, JOBS.c.client_key, JOBS.c.id, JOBS.c.request_hash).where(
                        JOBS.c.client_key.is_not(None)
                    )
                )
            }
            self._build(tx)
            tx.flush()
            self._flush_ledger(tx)
        for action in tx.after:
            action()

    def _build(self, tx: _Tx) -> None:
        """The engine from the database: teams, nodes, then every job that has not ended —
        pending ones queued again, running ones adopted on their GPUs when the backend still
        runs them (reconciliation), else queued again."""
        conn, now = tx.conn, tx.now
        rows = conn.execute(select(TEAMS)).all()
        self.teams = {
            r.name: Team(r.name, r.weight, dict(r.quota), r.budget_per_period) for r in rows
        }
        self.run_as = {r.name: r.run_as for r in rows if r.run_as}
        self.budgets = Budgets.for_teams(self.ledger, self.teams.values())
        self.watch = JobWatch(self.cfg.stragglers, self.cfg.breakers)
        for r in conn.execute(select(TEAMS.c.name, TEAMS.c.breaker_policy, TEAMS.c.webhook_url)):
            self.watch.set_team(r.name, r.breaker_policy, r.webhook_url)
        self.nodes = {r.name: dict(r._mapping) for r in conn.execute(select(NODES))}
        self.monitor = HealthMonitor(self.cfg.heartbeat_timeout_s)
        for name, n in self.nodes.items():
            self.monitor.heartbeat(name, now)
            if n["state"] != "up":
                self.monitor.report(name, now, HealthReport())
        self.sched = self._new_engine()
        if self.sched is not None:
            for name, n in self.nodes.items():
                if n["state"] not in IN_SERVICE:
                    self.sched.node_down(name, now)
        rows = conn.execute(
            select(JOBS).where(JOBS.c.state.in_(ACTIVE)).order_by(JOBS.c.seq)
        ).mappings()
        self.live, self.segs = {}, {}
        running_rows = {}
        for row in rows:
            self.live[row["id"]] = _Live(
                seq=row["seq"],
                spec=_spec(row),
                command=row["spec"]["command"],
                env=dict(row["env"]),
                submitted_at=row["submitted_at"],
                tier=row["tier"],
                last_checkpoint_at=row["last_checkpoint_at"],
            )
            if self.sched is not None and row["last_checkpoint_at"] is not None:
                self.sched.sdk_checkpoints.add(row["id"])
            if row["state"] == "running":
                running_rows[row["id"]] = row
                if row["seg_start"] is not None:
                    accrued = self._accrued(row["id"], row["seg_start"])
                    self.segs[row["id"]] = _Segment(
                        row["seg_start"],
                        row["seg_gpu_type"],
                        row["seg_gpus"],
                        row["seg_tier"],
                        row["seg_borrowed"],
                        accrued[-1].end if accrued else row["seg_start"],
                    )
        plan = reconcile(running_rows, self.backend.running())
        for job_id in plan.orphans:
            tx.after.append(lambda j=job_id: self.backend.stop(j, 0.0))
        adopt = set(plan.adopt)
        for job_id, live in list(self.live.items()):
            row = running_rows.get(job_id)
            ended = None
            if row is not None and job_id not in adopt:
                ended = self._ended_while_away(row)
                if ended is not None and self._record_end(tx, job_id, ended, row):
                    continue
            if self.sched is None:
                if row is not None:
                    self._requeue(tx, job_id, "no nodes are registered", stop=True)
                continue
            try:
                job = self.sched.resubmit(live.spec, live.submitted_at, Tier(live.tier))
            except InvalidInput as e:
                self._end(tx, job_id, "failed", f"no longer fits the cluster: {e}", stop=True)
                continue
            if row is None:
                continue
            alloc = self._allocation_from(row["allocation"])
            if job_id in adopt and alloc is not None:
                try:
                    self.sched.adopt(job, alloc, row["started_at"] or now)
                    continue
                except InvalidInput as e:
                    why = f"could not take it back after a restart: {e}"
            elif isinstance(ended, JobLost):
                self._requeue(
                    tx,
                    job_id,
                    f"node failure while the control plane was down: {ended.reason}",
                    lost_from=self._lost_from(job_id),
                    restart=True,
                    at=ended.at,
                )
                continue
            elif ended is not None:
                self._requeue(tx, job_id, "stopped after preemption", at=ended.at)
                continue
            elif row["preempting"]:  # the backend still ends it at its deadline
                why = "its preemption was under way at a restart: queued again"
            else:
                why = (
                    f"its process was gone after a restart and {self.backend.name} does not "
                    "know how it ended: started again"
                )
            self._requeue(tx, job_id, why, stop=job_id in adopt)
        if self.sched is not None:
            self._degraded = {name for name, n in self.nodes.items() if n["state"] == "degraded"}
            for name in self._degraded:
                self.sched.drain(name)
            self._replay_telemetry(conn)
        self._hold_spares()
        self._changed = True
        self._rebuild = False

    def _hold_spares(self) -> None:
        """Hold `hot_spares` nodes of each GPU type back for the jobs a node failure displaces
        (F2): the last healthy nodes with nothing on them, chosen again at every rebuild, so a
        spare that took a failed-over job is replaced by another empty node."""
        if not self.cfg.hot_spares or self.sched is None:
            return
        index = self.sched.index
        held: dict[str, int] = {}
        names: list[str] = []
        for node in reversed(self.sched.cluster.nodes):
            i, t = node.index, node.gpu_type
            empty = index.free_mask[i] == (1 << node.gpus) - 1
            if empty and not index.down[i] and held.get(t, 0) < self.cfg.hot_spares:
                held[t] = held.get(t, 0) + 1
                names.append(node.name)
        self.sched.reserve_spares(names)

    def _ended_while_away(self, row: Mapping[str, Any]) -> Any:
        """How a job the database has running, and the backend no longer runs, ended — the
        backend's answer (an event at the job's real end), or None when its fate is unknown
        (it never started, or the executor has forgotten it)."""
        ask = getattr(self.backend, "outcome", None)
        if ask is None or row["started_at"] is None:
            return None
        try:
            return ask(row["id"], row["started_at"])
        except Exception:
            log.exception("job %s: asking %s how it ended failed", row["id"], self.backend.name)
            return None

    def _record_end(self, tx: _Tx, job_id: str, ended: Any, row: Mapping[str, Any]) -> bool:
        """Record a job that ended while the control plane was away at its real end, charged
        up to then; False when the end puts it back in the queue instead (a node failure, or
        an exit on a preemption's notice)."""
        actor = self.backend.name
        if isinstance(ended, JobFinished):
            self._end(tx, job_id, "completed", "", exit_code=0, actor=actor, at=ended.at)
        elif isinstance(ended, JobLaunchFailed):
            self._never_ran(tx, job_id, ended.reason, actor)
        elif isinstance(ended, JobFailed) and not row["preempting"]:
            why = f"exited with code {ended.exit_code}"
            code = ended.exit_code
            self._end(tx, job_id, "failed", why, exit_code=code, actor=actor, at=ended.at)
        else:
            return False
        return True

    def _replay_telemetry(self, conn: Connection) -> None:
        """Rebuild the breaker and straggler state of running jobs from their stored reports
        of the current run (`watch.JobWatch.replay`)."""
        assert self.sched is not None
        for job_id, job in self.sched.running.items():
            rows = conn.execute(
                select(TELEMETRY.c.at, TELEMETRY.c.data)
                .where(TELEMETRY.c.job_id == job_id, TELEMETRY.c.at >= job.started_at)
                .order_by(TELEMETRY.c.id)
            )
            self.watch.replay(job_id, job.team, ((r.at, r.data) for r in rows))

    def _new_engine(self) -> Scheduler | None:
        if not self.nodes:
            return None
        racks = sorted({n["rack"] for n in self.nodes.values()})
        cluster = Cluster.build(
            "live",
            [Node(n["name"], n["gpu_type"], n["gpus"], n["rack"]) for n in self.nodes.values()],
            [Rack(r) for r in racks],
        )
        config = EngineConfig(tier2_grace_s=self.cfg.tier2_grace_s, restart_overhead_s=0.0)
        return Scheduler(
            cluster, self.teams.values(), self.cfg.policy, config, budget=self._budget_rule
        )

    def _budget_rule(self, team: str, tier: Tier) -> Tier:
        return self.budgets.effective_tier(team, tier, self._last_now)

    def _allocation_from(self, data: Mapping[str, Any] | None) -> Allocation | None:
        if not data or self.sched is None:
            return None
        try:
            slots = tuple(
                (self.sched.cluster.node(name).index, tuple(gpus))
                for name, gpus in data["nodes"].items()
            )
        except InvalidInput:
            return None
        return Allocation(data["gpu_type"], slots)

    # -- the tick: backend events, health, budgets, the cycle ------------------------------

    def _tick(self, tx: _Tx) -> None:
        now = tx.now
        failed, self._launch_failures = self._launch_failures, []
        for event in [*failed, *self.backend.poll()]:
            self._on_event(tx, event)
        if self._rebuild:
            self._build(tx)
        for verdict in self.monitor.check(now):
            node = self.nodes.get(verdict.node)
            if node is not None and node["state"] in IN_SERVICE:
                self._node_down(tx, verdict.node, "down", verdict.reason, SCHEDULER)
        if self.budgets.budgets:
            if self.budgets.open_period(now):
                self._changed = True
        if now - self._last_accrual >= 1.0:
            self._accrue(tx)
        if self.draining:
            if self.on_drained is not None and not (self.sched and self.sched.running):
                tx.after.append(self.on_drained)
                self.on_drained = None
            return
        if self.sched is None:
            return
        self._move_off_degraded(tx)
        due = self._changed and now - self._last_cycle >= self.cfg.cycle_interval_s
        if due or now >= self._wakeup or now - self._last_cycle >= self.cfg.idle_cycle_s:
            self._cycle(tx)
        if now - self._last_observed >= 1.0:
            self._observe()
            self._last_observed = now

    def _cycle(self, tx: _Tx) -> None:
        assert self.sched is not None
        t0 = time.perf_counter()
        result = self.sched.cycle(tx.now)
        self.metrics.cycle.observe(time.perf_counter() - t0)
        self._last_cycle = tx.now
        self._changed = False
        self._wakeup = result.next_wakeup if result.next_wakeup is not None else math.inf
        self.last_cycle_result = result
        for d in result.decisions:
            if isinstance(d, Start):
                self._on_start(tx, d)
            elif isinstance(d, Preempt):
                self._on_preempt(tx, d)
            elif isinstance(d, Resize):
                self._on_resize(tx, d)

    def _on_start(self, tx: _Tx, d: Start) -> None:
        assert self.sched is not None
        job = self.sched.jobs[d.job_id]
        live = self.live[d.job_id]
        self.watch.forget(d.job_id)  # a new run is watched afresh
        values, placement = self._place(tx, d.job_id, d.allocation, d.borrowed)
        tx.conn.execute(
            update(JOBS)
            .where(JOBS.c.id == d.job_id)
            .values(
                state="running",
                preempting=False,
                tier=int(job.tier),
                started_at=tx.now,
                first_start=func.coalesce(JOBS.c.first_start, tx.now),
                reason="",
                **values,
            )
        )
        if job.first_start == tx.now and job.preemptions == 0 and job.restarts == 0:
            self.metrics.queue_delay.labels(str(int(job.spec.tier))).observe(
                tx.now - live.submitted_at
            )
        by_node = values["allocation"]["nodes"]
        self._audit(tx, SCHEDULER, "start", d.job_id, allocation=by_node, borrowed=d.borrowed)
        tx.after.append(lambda: self._launch(placement))

    def _launch(self, placement: Placement) -> None:
        """Hand a committed start to the backend; one it refuses fails the job on the next
        tick (`JobLaunchFailed`) instead of leaving it running with no process."""
        try:
            self.backend.start(placement)
        except Exception as e:
            log.warning("job %s could not be started: %s", placement.job_id, e)
            why = str(e) or type(e).__name__
            self._launch_failures.append(JobLaunchFailed(placement.job_id, time.time(), why))

    def _on_preempt(self, tx: _Tx, d: Preempt) -> None:
        assert self.sched is not None
        job = self.sched.jobs[d.job_id]
        self.metrics.preemptions.labels(str(int(job.tier))).inc()
        self._audit(
            tx,
            SCHEDULER,
            "preempt",
            d.job_id,
            grace_s=d.grace_s,
            reason=d.reason,
            for_job=d.for_job,
        )
        if d.grace_s > 0:
            tx.conn.execute(
                update(JOBS)
                .where(JOBS.c.id == d.job_id)
                .values(preempting=True, preemptions=JOBS.c.preemptions + 1, reason=d.reason)
            )
            tx.after.append(lambda: self.backend.stop(d.job_id, d.grace_s))
            return
        # Grace 0: the engine has already queued the job again.
        self._close_segment(tx, d.job_id)
        tx.conn.execute(
            update(JOBS)
            .where(JOBS.c.id == d.job_id)
            .values(
                state="pending",
                preempting=False,
                allocation=None,
                started_at=None,
                preemptions=JOBS.c.preemptions + 1,
                reason=d.reason,
                **_no_segment(),
            )
        )
        tx.after.append(lambda: self.backend.stop(d.job_id, 0.0))

    def _on_resize(self, tx: _Tx, d: Resize) -> None:
        assert self.sched is not None
        job = self.sched.jobs[d.job_id]
        self._close_segment(tx, d.job_id)
        values, placement = self._place(tx, d.job_id, d.allocation, job.borrowed)
        tx.conn.execute(update(JOBS).where(JOBS.c.id == d.job_id).values(**values))
        by_node = values["allocation"]["nodes"]
        self._audit(tx, SCHEDULER, "resize", d.job_id, allocation=by_node, reason=d.reason)
        tx.after.append(lambda: self.backend.resize(placement))

    def _place(
        self, tx: _Tx, job_id: str, alloc: Allocation, borrowed: bool
    ) -> tuple[dict[str, Any], Placement]:
        """A job now holds `alloc` (a start or a resize): open its run segment, and return the
        job row's allocation and segment columns and what the backend is to run where."""
        assert self.sched is not None
        job = self.sched.jobs[job_id]
        live = self.live[job_id]
        by_node = {self.sched.cluster.nodes[n].name: list(g) for n, g in alloc.slots}
        self.segs[job_id] = _Segment(tx.now, alloc.gpu_type, alloc.gpus, job.tier, borrowed, tx.now)
        values = {
            "allocation": {"gpu_type": alloc.gpu_type, "nodes": by_node},
            "seg_start": tx.now,
            "seg_gpu_type": alloc.gpu_type,
            "seg_gpus": alloc.gpus,
            "seg_tier": int(job.tier),
            "seg_borrowed": borrowed,
        }
        placement = Placement(
            job_id=job_id,
            command=live.command,
            gpus_by_node={n: tuple(g) for n, g in by_node.items()},
            gpu_type=alloc.gpu_type,
            env=self._job_env(job_id, live, job.tier),
            team=job.team,
            tier=int(job.tier),
            walltime_s=live.spec.walltime_s,
            run_as=self.run_as.get(job.team),
        )
        return values, placement

    def _on_event(self, tx: _Tx, event: Any) -> None:
        if isinstance(event, NodeDown | NodeUp):
            self._backend_node(tx, event)
            return
        sched = self.sched
        if sched is None or event.job_id not in sched.running:
            return  # stale: the engine already queued it again (grace-0 stop, cancel)
        self._changed = True
        job_id = event.job_id
        if isinstance(event, JobStopped):
            sched.stopped(job_id, tx.now)
            why = "stopped: the server was drained" if self.draining else "stopped after preemption"
            self._requeue(tx, job_id, why)
        elif isinstance(event, JobFinished):
            sched.finished(job_id, tx.now)
            self._end(tx, job_id, "completed", "", exit_code=0, at=event.at)
        elif isinstance(event, JobFailed):
            sched.finished(job_id, tx.now)
            self._end(
                tx,
                job_id,
                "failed",
                f"exited with code {event.exit_code}",
                exit_code=event.exit_code,
                at=event.at,
            )
        elif isinstance(event, JobLost):
            lost_from = self._lost_from(job_id)
            sched.lost(job_id, tx.now)
            reason = f"node failure: {event.reason}"
            self._requeue(tx, job_id, reason, lost_from=lost_from, restart=True, at=event.at)
            log.warning("job %s requeued from its checkpoint: %s", job_id, reason)
        elif isinstance(event, JobLaunchFailed):
            sched.finished(job_id, tx.now)
            self._never_ran(tx, job_id, event.reason)
        elif isinstance(event, JobPlaced):
            self._placed(tx, event)

    def _backend_node(self, tx: _Tx, event: NodeDown | NodeUp) -> None:
        """The executor's own view of a node (Slurm drained it, or returned it to service). A
        node is taken back up only from a fault this executor reported (its reason starts with
        the executor's name), never from a cordon or a failed health check."""
        node = self.nodes.get(event.node)
        if node is None:
            return  # not registered: registration comes from the executor's inventory
        name = self.backend.name
        if isinstance(event, NodeDown):
            if node["state"] in IN_SERVICE:
                self._node_down(tx, event.node, "down", event.reason, name)
        elif node["state"] == "down" and node["reason"].startswith(f"{name}:"):
            self._node_up(tx, event.node, name)

    def _placed(self, tx: _Tx, event: JobPlaced) -> None:
        """The executor put the job on other GPU indices of its nodes than the engine chose:
        record them in the engine's books and as the job's allocation, or neither."""
        assert self.sched is not None
        job = self.sched.jobs[event.job_id]
        nodes = {n: list(g) for n, g in event.gpus_by_node}
        data = {"gpu_type": job.allocation.gpu_type, "nodes": nodes}
        alloc = self._allocation_from(data)
        if alloc is None or not self.sched.move_gpus(event.job_id, alloc):
            log.warning(
                "job %s: %s placed it on %s, not free in the engine's books",
                event.job_id,
                self.backend.name,
                nodes,
            )
            return
        tx.conn.execute(update(JOBS).where(JOBS.c.id == event.job_id).values(allocation=data))
        self._audit(tx, self.backend.name, "placed", event.job_id, allocation=nodes)

    def _requeue(
        self,
        tx: _Tx,
        job_id: str,
        reason: str,
        stop: bool = False,
        lost_from: float | None = None,
        restart: bool = False,
        at: float | None = None,
    ) -> None:
        """The job holds nothing any more and waits in the queue (the engine already knows);
        its run is charged up to `at` (when the executor says it ended; default now)."""
        self._close_segment(tx, job_id, lost_from, at)
        values: dict[str, Any] = dict(
            state="pending",
            preempting=False,
            allocation=None,
            started_at=None,
            reason=reason,
            **_no_segment(),
        )
        if restart:
            values["restarts"] = JOBS.c.restarts + 1
        if self.sched is not None and job_id in self.sched.jobs:
            values["tier"] = int(self.sched.jobs[job_id].tier)
        tx.conn.execute(update(JOBS).where(JOBS.c.id == job_id).values(**values))
        self._audit(tx, SCHEDULER, "requeue", job_id, reason=reason)
        if stop:
            tx.after.append(lambda: self.backend.stop(job_id, 0.0))

    def _end(
        self,
        tx: _Tx,
        job_id: str,
        state: str,
        reason: str,
        exit_code: int | None = None,
        stop: bool = False,
        actor: str = SCHEDULER,
        at: float | None = None,
    ) -> None:
        """The job has ended: recorded, and charged, at `at` (its real end when the executor
        knows it, e.g. after a restart; default now)."""
        end = self._close_segment(tx, job_id, at=at)
        tx.conn.execute(
            update(JOBS)
            .where(JOBS.c.id == job_id)
            .values(
                state=state,
                preempting=False,
                allocation=None,
                finished_at=end,
                exit_code=exit_code,
                reason=reason,
                **_no_segment(),
            )
        )
        live = self.live.pop(job_id, None)
        self.watch.forget(job_id)
        self.metrics.ended.labels(state).inc()
        if live is not None and state == "completed":
            self.metrics.jct.labels(str(int(live.spec.tier))).observe(end - live.submitted_at)
        self._audit(
            tx,
            actor,
            state if state != "cancelled" else "cancel",
            job_id,
            reason=reason,
            exit_code=exit_code,
        )
        if stop:
            tx.after.append(lambda: self.backend.stop(job_id, 0.0))

    def _close_segment(
        self, tx: _Tx, job_id: str, lost_from: float | None = None, at: float | None = None
    ) -> float:
        """Charge what is left of the job's run segment up to `at` (never past now nor before
        the segment began): the seconds since it was last charged (`_accrue`), or less when
        the accrued charges went too far. Returns the end used."""
        end = tx.now if at is None else min(at, tx.now)
        seg = self.segs.pop(job_id, None)
        live = self.live.get(job_id)
        if seg is None or live is None:
            return end
        end = max(end, seg.start)
        keeps = None
        if self.sched is not None and job_id in self.sched.jobs:
            keeps = self.sched.checkpoints(self.sched.jobs[job_id])
        self.charges.close_segment(
            self.ledger,
            live.spec,
            self._accrued(job_id, seg.start),
            gpu_type=seg.gpu_type,
            tier=seg.tier,
            gpus=seg.gpus,
            start=seg.start,
            end=end,
            preemptible=is_preemptible(seg.tier, seg.borrowed),
            lost_from=lost_from,
            keeps_checkpoints=keeps,
        )
        return end

    def _never_ran(self, tx: _Tx, job_id: str, why: str, actor: str = SCHEDULER) -> None:
        """A job whose command could not start fails, with the executor's error, and costs
        nothing: its run ends where it began, so what was accrued for it is refunded."""
        seg = self.segs.get(job_id)
        at = seg.start if seg is not None else None
        self._end(tx, job_id, "failed", f"could not start: {why}", actor=actor, at=at)

    def _lost_from(self, job_id: str) -> float | None:
        """Where a failure's lost work begins: the job's last checkpoint in its current run
        segment, else the segment's start (F2)."""
        seg = self.segs.get(job_id)
        lost_from = self.live[job_id].last_checkpoint_at
        if seg is not None and (lost_from is None or lost_from < seg.start):
            lost_from = seg.start
        return lost_from

    def _accrued(self, job_id: str, seg_start: float) -> list[Entry]:
        """The charges posted for the job's run segment that began at `seg_start` while it
        ran; the ledger is their only record, so a restart never charges their seconds twice.
        (Charges of earlier segments all begin before it.)"""
        return [
            e
            for e in self.ledger.audit(job_id)
            if e.kind == CHARGE and e.reason == RUN and e.start is not None and e.start >= seg_start
        ]

    def _accrue(self, tx: _Tx) -> None:
        """Charge each running job for the seconds it held its GPUs once `accrue_s` have passed
        since it was last charged (E5): spend, burn and budgets see running work, not only runs
        that ended. Each job falls due a minute after its own start, so the charges of many
        running jobs spread over the minute instead of stalling one tick (10,000 charges cost
        the loop about half a second). Every `accrue_s`, a team whose budget is spent has its
        running jobs run as its budget allows (`_exhausted`)."""
        due = tx.now - self.cfg.accrue_s
        for job_id, seg in self.segs.items():
            live = self.live.get(job_id)
            if live is None or seg.billed_to > due or tx.now <= seg.billed_to:
                continue
            self.charges.charge_segment(
                self.ledger,
                live.spec,
                gpu_type=seg.gpu_type,
                tier=seg.tier,
                gpus=seg.gpus,
                start=seg.billed_to,
                end=tx.now,
                preemptible=is_preemptible(seg.tier, seg.borrowed),
            )
            seg.billed_to = tx.now
        self._last_accrual = tx.now
        if tx.now - self._last_budget_check >= self.cfg.accrue_s:
            self._last_budget_check = tx.now
            self._exhausted(tx)

    def _exhausted(self, tx: _Tx) -> None:
        """Running jobs of a team that has spent its budget run at the tier an exhausted budget
        allows (E1, `BudgetPolicy.exhausted_tier`) from now on, as new ones are admitted: they
        become victims of that tier and are billed at its price in a new run segment."""
        if self.sched is None or not self.budgets.budgets:
            return
        cap = self.budgets.policy.exhausted_tier
        broke = {t for t in self.budgets.budgets if not self.budgets.can_spend(t, tx.now)}
        if not broke:
            return
        for job_id, job in list(self.sched.running.items()):
            if job.team not in broke or job.tier >= cap or job_id not in self.segs:
                continue
            self.sched.demote(job_id, cap, tx.now)
            old = self.segs[job_id]
            self._close_segment(tx, job_id)
            self.segs[job_id] = _Segment(
                tx.now, old.gpu_type, old.gpus, int(cap), job.borrowed, tx.now
            )
            self.live[job_id].tier = int(cap)
            reason = f"budget of team {job.team} spent: runs at tier {int(cap)}"
            tx.conn.execute(
                update(JOBS)
                .where(JOBS.c.id == job_id)
                .values(
                    tier=int(cap),
                    reason=reason,
                    seg_start=tx.now,
                    seg_tier=int(cap),
                    seg_borrowed=job.borrowed,
                )
            )
            self._audit(tx, SCHEDULER, "demote", job_id, tier=int(cap), reason=reason)
            self._changed = True

    def _flush_ledger(self, tx: _Tx) -> None:
        new = self.ledger.entries(since=self._persisted)
        if not new:
            return
        insert_rows(
            tx.conn,
            LEDGER,
            [
                {
                    "seq": e.seq,
                    "kind": e.kind,
                    "team": e.team,
                    "job_id": e.job_id,
                    "at": e.at,
                    "credits": e.credits,
                    "entry": e.to_json(),
                }
                for e in new
            ],
        )
        self._persisted += len(new)
        for e in new:
            self._count_spend(e)

    def _count_spend(self, e: Any) -> None:
        if e.kind == "charge":
            self.spent[e.team] = self.spent.get(e.team, 0.0) + e.credits
            if e.reason in (LOST_WORK, RERUN):
                self.metrics.lost_gpu_hours.inc(e.gpu_seconds / 3600)
        elif e.kind == "refund":
            self.spent[e.team] = self.spent.get(e.team, 0.0) - e.credits
            if e.reason == FAILURE_ABSORBED and e.start is not None:
                # Lost seconds charged as they ran (`_accrue`), given back when the run failed.
                charge = next(c for c in self.ledger.audit(e.job_id) if c.seq == e.refund_of)
                self.metrics.lost_gpu_hours.inc(charge.gpus * (e.end - e.start) / 3600)

    def _audit(self, tx: _Tx, actor: str, action: str, subject: str, **detail: Any) -> None:
        """Record a state change in the audit log, and in the server's log at level info
        (every change but a submission, the one that comes in bursts of thousands)."""
        kept = {k: v for k, v in detail.items() if v is not None}
        tx.audit.append(
            {"at": tx.now, "actor": actor, "action": action, "subject": subject, "detail": kept}
        )
        if action != "submit" and log.isEnabledFor(logging.INFO):
            said = ", ".join(f"{k}={v}" for k, v in kept.items())
            log.info("%s %s by %s%s", action, subject, actor, f" ({said})" if said else "")

    def _job_env(self, job_id: str, live: _Live, tier: int) -> dict[str, str]:
        return {
            **live.env,
            "ARBITER_URL": self.cfg.public_url,
            "ARBITER_JOB_TOKEN": self.job_token(job_id),
            "ARBITER_TEAM": live.spec.team,
            "ARBITER_TIER": str(int(tier)),
            "ARBITER_CHECKPOINT_DIR": str(self.cfg.work_root / job_id / "checkpoints"),
        }

    def _node_down(self, tx: _Tx, name: str, state: str, reason: str, actor: str) -> None:
        sched = self.sched
        affected = sched.node_down(name, tx.now) if sched is not None else []
        for job_id in affected:
            lost_from = self._lost_from(job_id)
            self._requeue(tx, job_id, reason, stop=True, lost_from=lost_from, restart=True)
        self.nodes[name].update(state=state, reason=reason)
        tx.conn.execute(
            update(NODES).where(NODES.c.name == name).values(state=state, reason=reason)
        )
        self._audit(tx, actor, f"node-{state}", name, reason=reason, requeued=affected)
        self._changed = True

    def _node_up(self, tx: _Tx, name: str, actor: str) -> None:
        if self.sched is not None:
            self.sched.node_up(name, tx.now)
        self.monitor.uncordon(name, tx.now)
        self.nodes[name].update(state="up", reason="")
        tx.conn.execute(update(NODES).where(NODES.c.name == name).values(state="up", reason=""))
        self._audit(tx, actor, "node-up", name)
        self._changed = True

    def _observe(self) -> None:
        m = self.metrics
        sched = self.sched
        if sched is None:
            return
        total = sched.cluster.total_gpus
        down = sum(sched.cluster.nodes[i].gpus for i, d in enumerate(sched.index.down) if d)
        busy = sum(j.gpus_held for j in sched.running.values())
        free = sched.index.total_free
        m.gpus.labels("total").set(total)
        m.gpus.labels("busy").set(busy)
        m.gpus.labels("free").set(free)
        m.gpus.labels("down").set(down)
        m.utilisation.set(busy / (total - down) if total > down else 0.0)
        r = self.last_cycle_result
        if r is not None:
            m.fragmentation.set(r.fragmentation)
            m.stranded.set(r.stranded_gpus)
        counts: dict[tuple[str, str], float] = {}
        for job_id in self.live:
            job = sched.jobs.get(job_id)
            if job is not None:
                key = (job.state.value, str(int(job.tier)))
                counts[key] = counts.get(key, 0) + 1
        m.set_labelled(m.jobs, counts)
        states: dict[tuple[str], float] = {}
        for n in self.nodes.values():
            states[(n["state"],)] = states.get((n["state"],), 0) + 1
        m.set_labelled(m.nodes, states)
        self.burn = self.charges.burn_rates(sched.running.values())
        m.set_labelled(m.burn, {(t,): v for t, v in self.burn.items()})
        m.set_labelled(m.spent, {(t,): v for t, v in self.spent.items()})

    # -- commands (run on the loop thread, in the batch's transaction) ---------------------

    def cmd_submit(
        self, tx: _Tx, who: Principal, req: JobSubmit, key: str | None, request_hash: str
    ) -> tuple[dict[str, Any], bool]:
        """Queue a job; returns its row and whether it is new. A repeated idempotency key
        returns the job it created the first time."""
        team = self._team_for(who, req.team)
        key = key or req.client_key
        if key is not None and (team, key) in self.keys:
            job_id, first_hash = self.keys[(team, key)]
            if first_hash != request_hash:
                raise Conflict(
                    f"Idempotency-Key {key!r} was already used for job {job_id} with a "
                    "different request"
                )
            if job_id in tx.new_jobs:
                return dict(tx.new_jobs[job_id]), False
            return self.job_row(tx.conn, job_id), False
        if self.sched is None:
            raise Unavailable("no GPU nodes are registered yet")
        if self.draining:
            raise Unavailable("the server is draining: it takes no new jobs before it stops")
        seq = self.next_seq
        job_id = f"j{seq}"
        spec = _spec_from_request(job_id, team, req, tx.now)
        job = self.sched.submit(spec, tx.now)
        self.next_seq += 1
        if key is not None:
            self.keys[(team, key)] = (job_id, request_hash)
        row = {
            "seq": seq,
            "id": job_id,
            "team": team,
            "name": req.name,
            "spec": _spec_json(spec),
            "env": dict(req.env),
            "tier": int(job.tier),
            "state": "pending",
            "preempting": False,
            "client_key": key,
            "request_hash": request_hash if key is not None else None,
            "submitted_at": tx.now,
            "preemptions": 0,
            "restarts": 0,
            "reason": "",
            "telemetry": {},
            "seg_borrowed": False,
        }
        tx.new_jobs[job_id] = row
        self.live[job_id] = _Live(seq, spec, req.command, dict(req.env), tx.now, int(job.tier))
        self._audit(tx, who.actor, "submit", job_id, tier=int(spec.tier), gpus=spec.gpus)
        self.metrics.submissions.labels(str(int(spec.tier))).inc()
        self._changed = True
        return row, True

    def cmd_drain(self, tx: _Tx, who: Principal, grace_s: float | None) -> dict[str, Any]:
        """Stop for good (admin): no job starts any more, every running job is stopped with the
        notice of its tier (a preemption's; at most `grace_s` when given) and queued again, and
        once none runs the server exits (`on_drained`). Nothing is lost: the queue waits in
        the database for the next start. (A plain stop or crash instead leaves jobs running for
        the next start to adopt.)"""
        who.require_admin()
        self.draining = True
        stopping = []
        if self.sched is not None:
            for job_id, job in self.sched.running.items():
                grace = self.sched.notice_of_tier(job.tier)
                if grace_s is not None:
                    grace = min(grace, grace_s)
                tx.conn.execute(
                    update(JOBS)
                    .where(JOBS.c.id == job_id)
                    .values(preempting=True, reason="the server is draining")
                )
                tx.after.append(lambda j=job_id, g=grace: self.backend.stop(j, g))
                stopping.append(job_id)
        self._audit(tx, who.actor, "drain", "server", grace_s=grace_s, stopping=stopping)
        return {"draining": True, "stopping": stopping}

    def cmd_cancel(self, tx: _Tx, who: Principal, job_id: str) -> dict[str, Any]:
        row = self._visible_job(tx.conn, who, job_id)
        if row["state"] not in ACTIVE:
            raise Conflict(f"job {job_id} is already {row['state']}")
        was_running = row["state"] == "running"
        if self.sched is not None and job_id in self.sched.jobs:
            self.sched.cancel(job_id, tx.now)
        self._end(
            tx, job_id, "cancelled", f"cancelled by {who.actor}", stop=was_running, actor=who.actor
        )
        self._changed = True
        return self.job_row(tx.conn, job_id)

    def cmd_put_team(self, tx: _Tx, who: Principal, name: str, req: TeamPut) -> dict[str, Any]:
        who.require_admin()
        team = Team(name, req.weight, dict(req.quota), req.budget_per_period)
        others = [t for n, t in self.teams.items() if n != name]
        if self.sched is not None:
            check_quotas([*others, team], self.sched.cluster.gpus_by_type())
        values = {
            "weight": team.weight,
            "quota": dict(team.quota),
            "budget_per_period": team.budget_per_period,
            "breaker_policy": req.breaker_policy,
            "webhook_url": str(req.webhook_url) if req.webhook_url is not None else None,
            "run_as": req.run_as,
        }
        if name in self.teams:
            tx.conn.execute(update(TEAMS).where(TEAMS.c.name == name).values(**values))
        else:
            tx.conn.execute(insert(TEAMS).values(name=name, **values))
        self.teams[name] = team
        self.watch.set_team(name, req.breaker_policy, values["webhook_url"])
        if req.run_as:
            self.run_as[name] = req.run_as
        else:
            self.run_as.pop(name, None)
        self._audit(tx, who.actor, "team-set", name, **values)
        self._rebuild = True
        return {"name": name, **values}

    def cmd_delete_team(self, tx: _Tx, who: Principal, name: str) -> dict[str, Any]:
        """Remove a team that has no active jobs. Its tokens are revoked with it, so a team
        made again under the name starts with none; its ledger entries stay (bills are
        history)."""
        who.require_admin()
        if name not in self.teams:
            raise NotFound(f"team {name!r} does not exist")
        active = tx.conn.execute(
            select(JOBS.c.id).where(JOBS.c.team == name, JOBS.c.state.in_(ACTIVE)).limit(1)
        ).first()
        if active is not None:
            raise Conflict(f"team {name!r} has active jobs (e.g. {active.id}); cancel them first")
        live_tokens = (TOKENS.c.team == name, TOKENS.c.revoked_at.is_(None))
        revoked = list(tx.conn.execute(select(TOKENS.c.id).where(*live_tokens)).scalars())
        tx.conn.execute(update(TOKENS).where(*live_tokens).values(revoked_at=tx.now))
        tx.conn.execute(delete(TEAMS).where(TEAMS.c.name == name))
        del self.teams[name]
        self.run_as.pop(name, None)
        if self.auth is not None:
            for token_id in revoked:
                tx.after.append(lambda t=token_id: self.auth.forget(t))
        self._audit(tx, who.actor, "team-delete", name, tokens_revoked=revoked)
        self._rebuild = True
        return {"name": name, "tokens_revoked": revoked}

    def cmd_create_token(
        self, tx: _Tx, who: Principal, role: str, team: str | None, label: str
    ) -> dict[str, Any]:
        who.require_admin()
        if role == "team":
            if team is None:
                raise InvalidInput("team: a team token needs a team")
            if team not in self.teams:
                raise NotFound(f"team {team!r} does not exist (create it with PUT /v1/teams)")
        elif team is not None:
            raise InvalidInput(f"team: a {role} token belongs to no team")
        token = new_token()
        res = tx.conn.execute(
            insert(TOKENS).values(
                hash=hash_token(token), role=role, team=team, label=label, created_at=tx.now
            )
        )
        token_id = res.inserted_primary_key[0]
        self._audit(tx, who.actor, "token-create", f"token#{token_id}", role=role, team=team)
        return {"id": token_id, "role": role, "team": team, "label": label, "token": token}

    def cmd_revoke_token(self, tx: _Tx, who: Principal, token_id: int) -> dict[str, Any]:
        who.require_admin()
        found = tx.conn.execute(
            update(TOKENS)
            .where(TOKENS.c.id == token_id, TOKENS.c.revoked_at.is_(None))
            .values(revoked_at=tx.now)
        )
        if found.rowcount == 0:
            raise NotFound(f"token {token_id} does not exist or is already revoked")
        if self.auth is not None:
            tx.after.append(lambda: self.auth.forget(token_id))
        self._audit(tx, who.actor, "token-revoke", f"token#{token_id}")
        return {"id": token_id, "revoked_at": tx.now}

    def cmd_put_prices(self, tx: _Tx, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
        who.require_admin()
        table = PriceTable.from_dict(body, source="prices")
        doc = {
            "on_demand": dict(table.on_demand),
            "preemptible": dict(table.preemptible),
            "gpu_multipliers": dict(table.gpu_multipliers),
            "default_multiplier": table.default_multiplier,
            "credit_value": table.credit_value,
            "currency": table.currency,
        }
        stored = {
            **doc,
            "on_demand": _str_keys(doc["on_demand"]),
            "preemptible": _str_keys(doc["preemptible"]),
        }
        exists = tx.conn.execute(select(SETTINGS.c.key).where(SETTINGS.c.key == "prices"))
        if exists.first():
            tx.conn.execute(update(SETTINGS).where(SETTINGS.c.key == "prices").values(value=stored))
        else:
            tx.conn.execute(insert(SETTINGS).values(key="prices", value=stored))
        self.charges = ChargeModel(table)
        self._audit(tx, who.actor, "prices-set", "prices", **stored)
        return stored

    def cmd_register_node(
        self, tx: _Tx, who: Principal, name: str, req: NodeRegister
    ) -> dict[str, Any]:
        if who.role not in ("admin", "agent"):
            raise Forbidden("registering nodes needs an admin or agent token")
        _check_name(name, "node")
        spec = {"gpu_type": req.gpu_type, "gpus": req.gpus, "rack": req.rack}
        Node(name, req.gpu_type, req.gpus, req.rack)  # validates
        old = self.nodes.get(name)
        if old is not None and {k: old[k] for k in spec} != spec:
            busy = self.sched is not None and any(
                name in (self.sched.cluster.nodes[n].name for n in j.allocation.nodes)
                for j in self.sched.running.values()
            )
            if busy:
                raise Conflict(f"node {name} runs jobs; drain it before changing its GPUs")
            if self.sched is not None:
                capacity = self.sched.cluster.gpus_by_type()
                capacity[old["gpu_type"]] -= old["gpus"]
                capacity[req.gpu_type] = capacity.get(req.gpu_type, 0) + req.gpus
                check_quotas(list(self.teams.values()), capacity)
        if req.gpu_type not in GPU_CATALOG:
            known = ", ".join(GPU_CATALOG)
            raise InvalidInput(f"gpu_type: unknown GPU type {req.gpu_type!r} (known: {known})")
        if old is None:
            row = {
                "name": name,
                **spec,
                "state": "up",
                "reason": "",
                "registered_at": tx.now,
                "last_heartbeat": tx.now,
                "health": {},
            }
            tx.conn.execute(insert(NODES).values(**row))
            self.nodes[name] = row
            self._audit(tx, who.actor, "node-register", name, **spec)
            self._rebuild = True
        elif {k: old[k] for k in spec} != spec:
            tx.conn.execute(update(NODES).where(NODES.c.name == name).values(**spec))
            old.update(spec)
            self._audit(tx, who.actor, "node-change", name, **spec)
            self._rebuild = True
        if old is not None:
            # Registering again is a sign of life: on Slurm and Kubernetes the executor's node
            # poll does it for every healthy node, and it is their only heartbeat.
            old["last_heartbeat"] = tx.now
            tx.conn.execute(update(NODES).where(NODES.c.name == name).values(last_heartbeat=tx.now))
        self.monitor.heartbeat(name, tx.now)
        if (
            self.nodes[name]["state"] == "down"
            and "missed heartbeats" in self.nodes[name]["reason"]
        ):
            self._node_up(tx, name, who.actor)
        return dict(self.nodes[name])

    def cmd_heartbeat(self, tx: _Tx, who: Principal, name: str, hb: Heartbeat) -> dict[str, Any]:
        if who.role not in ("admin", "agent"):
            raise Forbidden("heartbeats need an admin or agent token")
        node = self.nodes.get(name)
        if node is None:
            raise NotFound(f"node {name!r} is not registered")
        health = hb.model_dump(exclude_none=True)
        self.monitor.report(
            name,
            tx.now,
            HealthReport(tuple(hb.xids), hb.ecc_uncorrectable, hb.nvlink_down, hb.temperature_c),
        )
        if node["state"] == "down" and "missed heartbeats" in node["reason"]:
            self._node_up(tx, name, who.actor)
        node.update(last_heartbeat=tx.now, health=health)
        tx.conn.execute(
            update(NODES).where(NODES.c.name == name).values(last_heartbeat=tx.now, health=health)
        )
        return {"name": name, "state": node["state"]}

    def cmd_node_state(
        self, tx: _Tx, who: Principal, name: str, up: bool, reason: str
    ) -> dict[str, Any]:
        who.require_admin()
        node = self.nodes.get(name)
        if node is None:
            raise NotFound(f"node {name!r} is not registered")
        if up and node["state"] != "up":
            self._node_up(tx, name, who.actor)
        elif not up and node["state"] == "up":
            self._node_down(tx, name, "cordoned", reason or f"cordoned by {who.actor}", who.actor)
        return dict(node)

    def cmd_telemetry(self, tx: _Tx, job_id: str, data: Telemetry) -> dict[str, Any]:
        live = self.live.get(job_id)
        if live is None:
            raise Conflict(f"job {job_id} is not active")
        job = self.sched.running.get(job_id) if self.sched is not None else None
        if data.node is not None and job is not None:
            # A job may speak only for its own nodes: a step time is what marks a node degraded.
            names = [self.sched.cluster.nodes[n].name for n in job.allocation.nodes]
            if data.node not in names:
                raise InvalidInput(
                    f"node: job {job_id} runs on {', '.join(names)}, not on {data.node!r}"
                )
        doc = data.data()
        if data.checkpoint_at is not None or data.event == "checkpoint":
            live.last_checkpoint_at = data.checkpoint_at or tx.now
            if self.sched is not None:
                self.sched.sdk_checkpoints.add(job_id)
        tx.conn.execute(insert(TELEMETRY).values(job_id=job_id, at=tx.now, data=doc))
        tx.conn.execute(
            update(JOBS)
            .where(JOBS.c.id == job_id)
            .values(telemetry={**doc, "at": tx.now}, last_checkpoint_at=live.last_checkpoint_at)
        )
        if job is not None:
            trip, straggler = self.watch.observe(job_id, job.team, tx.now, data)
            if trip is not None:
                self._tripped(tx, trip)
            if straggler is not None and job_id in self.live:
                self._straggler(tx, straggler, job.team)
        return {"job_id": job_id, "at": tx.now}

    def _tripped(self, tx: _Tx, trip: Trip) -> None:
        """A circuit breaker tripped on a running job (F5): under the team's `stop` policy the
        job fails and its GPUs are released, under `flag` it runs on, flagged. Either way the
        reason is on the job, in the audit log and the metrics, and sent to the team."""
        assert self.sched is not None
        job_id, breaker = trip.job_id, trip.detection.breaker.value
        self.metrics.breaker_trips.labels(breaker, trip.action.value).inc()
        saved_h = 0.0
        if trip.action is Action.STOP:
            # The GPU time it would still have held, counted as the simulator counts it.
            saved_h = gpu_s_saved_by_stop(self.sched.jobs[job_id], tx.now) / 3600
            self.sched.cancel(job_id, tx.now)
            self._end(tx, job_id, "failed", trip.reason, stop=True)
            self.metrics.breaker_saved_gpu_hours.inc(saved_h)
        else:
            reason = f"flagged by {trip.reason}"
            tx.conn.execute(update(JOBS).where(JOBS.c.id == job_id).values(reason=reason))
        self._audit(
            tx,
            SCHEDULER,
            f"breaker-{trip.action.value}",
            job_id,
            breaker=breaker,
            step=trip.detection.step,
            reason=trip.reason,
            saved_gpu_hours=saved_h if trip.action is Action.STOP else None,
        )
        self._notify(tx, trip.team, f"Arbiter: {trip.message}")
        self._changed = True

    def _straggler(self, tx: _Tx, found: Straggler, team: str) -> None:
        """A node's ranks held a gang back: the node is marked degraded (it takes no new work,
        its jobs run on) and the team is told; the gang is restarted without it as soon as a
        healthy node is free (`_move_off_degraded`)."""
        node = self.nodes.get(found.node)
        if node is None or node["state"] != "up" or self.sched is None:
            return  # not a node of ours, or already out of service
        self.sched.drain(found.node)
        self._degraded.add(found.node)
        node.update(state="degraded", reason=found.reason)
        tx.conn.execute(
            update(NODES)
            .where(NODES.c.name == found.node)
            .values(state="degraded", reason=found.reason)
        )
        self.metrics.stragglers.inc()
        self._audit(tx, SCHEDULER, "node-degraded", found.node, reason=found.reason)
        self._notify(
            tx,
            team,
            f"Arbiter: node {found.node} marked degraded ({found.reason}); job "
            f"{found.job_id} restarts from its checkpoint without it when a healthy node is free",
        )
        self._changed = True
        self._move_off_degraded(tx)

    def _move_off_degraded(self, tx: _Tx) -> None:
        """Restart each multi-node job that runs on a degraded node from its checkpoint, once
        healthy GPUs of its type are free for the part it holds there (it is queued again,
        and the engine places it; a degraded node offers no GPUs)."""
        sched = self.sched
        if sched is None or not self._degraded:
            return
        for name in sorted(self._degraded):
            if self.nodes[name]["state"] != "degraded":
                self._degraded.discard(name)  # taken back up, or down since
                continue
            index = sched.cluster.node(name).index
            for job_id in sorted(sched.node_jobs[index]):
                job = sched.running.get(job_id)
                if job is None or job.allocation is None or len(job.allocation.nodes) < 2:
                    continue
                there = sum(len(g) for n, g in job.allocation.slots if n == index)
                if sched.index.type_free[job.allocation.gpu_type] < there:
                    continue
                live, seg = self.live[job_id], self.segs.get(job_id)
                lost_from = live.last_checkpoint_at
                if seg is not None and (lost_from is None or lost_from < seg.start):
                    lost_from = seg.start
                sched.restart(job_id, tx.now)
                why = f"restarted without degraded node {name}"
                self._requeue(tx, job_id, why, stop=True, lost_from=lost_from, restart=True)
                self._changed = True

    def _notify(self, tx: _Tx, team: str, text: str) -> None:
        """Send `text` to the team's webhook, if it has one, once the transaction commits."""
        url = self.watch.webhooks.get(team)
        if url is not None:
            tx.after.append(lambda: self.webhooks.send(url, text))

    # -- helpers ---------------------------------------------------------------------------

    def _team_for(self, who: Principal, team: str | None) -> str:
        if who.role == "team":
            if team is not None and team != who.team:
                raise Forbidden(f"a token of team {who.team} cannot submit for team {team}")
            assert who.team is not None
            return who.team
        if who.role != "admin":
            raise Forbidden("submitting jobs needs a team or admin token")
        if team is None:
            raise InvalidInput("team: an admin must say which team the job is for")
        if team not in self.teams:
            raise InvalidInput(f"team: unknown team {team!r}")
        return team

    def _visible_job(self, conn: Connection, who: Principal, job_id: str) -> dict[str, Any]:
        row = conn.execute(select(JOBS).where(JOBS.c.id == job_id)).mappings().first()
        if row is None or not who.may_act_for(row["team"]):
            raise NotFound(f"job {job_id} not found")
        return dict(row)

    @staticmethod
    def job_row(conn: Connection, job_id: str) -> dict[str, Any]:
        row = conn.execute(select(JOBS).where(JOBS.c.id == job_id)).mappings().first()
        if row is None:
            raise NotFound(f"job {job_id} not found")
        return dict(row)


def _check_name(name: str, what: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", name):
        raise InvalidInput(f"{what}: name {name!r} must be letters, digits, '.', '_' or '-'")


def _no_segment() -> dict[str, Any]:
    return {
        "seg_start": None,
        "seg_gpu_type": None,
        "seg_gpus": None,
        "seg_tier": None,
        "seg_borrowed": False,
    }


def _str_keys(d: Mapping[int, float]) -> dict[str, float]:
    return {str(k): v for k, v in d.items()}


def _spec_from_request(job_id: str, team: str, req: JobSubmit, now: float) -> JobSpec:
    return JobSpec(
        id=job_id,
        team=team,
        tier=Tier(req.tier),
        gpus=req.gpus,
        duration_s=LIVE_WORK_S,
        submit_s=now,
        gpu_types=_accepted(req),
        walltime_s=req.walltime_s,
        min_gpus=req.min_gpus,
        max_gpus=req.max_gpus,
        max_racks=req.max_racks,
        tp_size=req.tp_size,
        checkpoint_interval_s=req.checkpoint_interval_s,
        power_profile=req.power_profile,
        gpu_milli=req.gpu_milli,
        kind=JobKind(req.kind),
        latency_slo_ms=req.latency_slo_ms,
        justification=req.justification,
        data_locality=req.data_locality,
        command=req.command,
    )


def _accepted(req: JobSubmit) -> dict[str, float]:
    """Listed types without speeds get the catalog speed."""
    if isinstance(req.gpu_types, list):
        out = {}
        for name in req.gpu_types:
            if name not in GPU_CATALOG:
                raise InvalidInput(f"gpu_types: unknown GPU type {name!r}")
            out[name] = GPU_CATALOG[name].speed
        return out
    return req.accepted_types()


_SPEC_FIELDS = (
    "tier",
    "gpus",
    "duration_s",
    "submit_s",
    "gpu_types",
    "walltime_s",
    "min_gpus",
    "max_gpus",
    "max_racks",
    "tp_size",
    "checkpoint_interval_s",
    "power_profile",
    "gpu_milli",
    "kind",
    "latency_slo_ms",
    "justification",
    "data_locality",
    "command",
)


def _spec_json(spec: JobSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _SPEC_FIELDS:
        value = getattr(spec, name)
        if name == "gpu_types":
            value = dict(value)
        elif name == "tier":
            value = int(value)
        elif name == "kind":
            value = str(value)
        out[name] = value
    return out


def _spec(row: Mapping[str, Any]) -> JobSpec:
    s = dict(row["spec"])
    return JobSpec(
        id=row["id"],
        team=row["team"],
        tier=Tier(s.pop("tier")),
        kind=JobKind(s.pop("kind")),
        gpu_types=dict(s.pop("gpu_types")),
        **s,
    )


def job_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """A job as the API shows it."""
    spec = row["spec"]
    state = "preempting" if row["preempting"] and row["state"] == "running" else row["state"]
    alloc = row.get("allocation")
    return {
        "id": row["id"],
        "name": row["name"],
        "team": row["team"],
        "state": state,
        "tier": row["tier"],
        "tier_requested": spec["tier"],
        "gpus": spec["gpus"],
        "gpu_types": sorted(spec["gpu_types"]),
        "kind": spec["kind"],
        "latency_slo_ms": spec.get("latency_slo_ms"),  # rows from before it was stored lack it
        "command": spec["command"],
        "submitted_at": row["submitted_at"],
        "first_start": row.get("first_start"),
        "started_at": row.get("started_at"),
        "finished_at": row.get("finished_at"),
        "allocation": alloc,
        "preemptions": row["preemptions"],
        "restarts": row["restarts"],
        "exit_code": row.get("exit_code"),
        "reason": row["reason"],
        "client_key": row.get("client_key"),
        "telemetry": row.get("telemetry") or {},
    }
