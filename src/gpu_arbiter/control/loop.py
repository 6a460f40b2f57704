"""The control loop: the one thread that owns the engine, the ledger and every database write.

API handlers never change state themselves: they hand the loop a command (`commands.py`) and
wait for its answer. The loop takes every command that is waiting (up to `max_batch`), applies
them in one transaction and commits before answering any of them — group commit, so one fsync
acknowledges a whole burst of submissions while each acknowledged one is on disk. Each command
validates fully before it changes anything, so a refused command leaves no trace in the batch.

Between batches the loop ticks: it applies what the backend reported, checks node health,
charges running jobs, and runs a scheduling cycle of the same engine the simulator uses, on the
wall clock, whenever something changed (at most every `cycle_interval_s`), when the policy
asked to be woken, or every `idle_cycle_s`. The decisions are written to the database first
and carried out on the backend after the commit (`apply.py`), so a crash in between is repaired
by reconciliation on restart (`rebuild.py`).

If a transaction fails unexpectedly, the in-memory state may no longer match the database:
the loop throws it away and rebuilds everything from the database and the backend.

This module decides only when things happen; what they do lives beside it: `commands.py` (the
API's requests), `apply.py` (decisions and backend events), `rebuild.py` (loading and
reconciling), `accounting.py` (segments, ledger, metrics), `state.py` (what the loop knows).
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection, Engine

from gpu_arbiter.backends.base import Backend
from gpu_arbiter.control.accounting import Accounts, observe
from gpu_arbiter.control.apply import Applier
from gpu_arbiter.control.auth import Authenticator
from gpu_arbiter.control.commands import Commands
from gpu_arbiter.control.config import ServerConfig
from gpu_arbiter.control.metrics import Metrics
from gpu_arbiter.control.notify import Webhooks
from gpu_arbiter.control.rebuild import Rebuild
from gpu_arbiter.control.state import IN_SERVICE, SCHEDULER, LoopState, Tx
from gpu_arbiter.control.store import dropped
from gpu_arbiter.control.watch import JobWatch
from gpu_arbiter.domain import ArbiterError
from gpu_arbiter.reliability.health import HealthMonitor

log = logging.getLogger("gpu_arbiter.control")


@dataclass(slots=True)
class Command:
    """One request for the loop: `fn(tx, *args)`, its result or error set on `future`."""

    fn: Callable[..., Any]
    args: tuple
    future: Future


_STOP = object()


class ControlLoop:
    """The loop's thread and its timing. What it knows is `state` (`LoopState`) and
    `accounts` (the books); `commands` are what the API hands it, `apply` turns decisions and
    events into rows and backend calls, `rebuild` fills the state from the database.

    Without its thread (tests, tools) the loop is driven by `load`, `transaction`, `run_batch`
    and `tick`, and `clock` is the wall clock it stamps rows and decisions with (one moved by
    hand makes an hour pass in a test); its thread waits on real time either way."""

    def __init__(
        self,
        db: Engine,
        backend: Backend,
        config: ServerConfig,
        auth: Authenticator | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.clock = clock
        self._conn: Connection | None = None
        self.backend = backend
        self.cfg = config
        self.metrics = metrics or Metrics()
        self.webhooks = Webhooks(self.metrics.webhooks)
        self.state = LoopState(
            monitor=HealthMonitor(config.heartbeat_timeout_s),
            watch=JobWatch(config.stragglers, config.breakers),
        )
        self.accounts = Accounts(self.metrics, config.accrue_s)
        self.apply = Applier(
            self.state, self.accounts, backend, config, self.metrics, self.webhooks
        )
        self.commands = Commands(self.state, self.accounts, self.apply, backend, auth, self.metrics)
        self.rebuild = Rebuild(
            self.state, self.accounts, self.apply, backend, config, lambda: self._last_now
        )
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._last_now = 0.0
        self._last_cycle = 0.0
        self._last_tick = 0.0
        self._last_observed = 0.0
        self._wakeup = math.inf
        self.last_cycle_result: Any = None
        # Called once, on the loop's thread after a commit, when a drain has stopped every job.
        self.on_drained: Callable[[], None] | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self.load()
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
        self._inbox.put(Command(fn, args, fut))
        return fut

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.wrap_future(self.call(fn, *args))

    def check_job_token(self, job_id: str, token: str) -> bool:
        return hmac.compare_digest(self.state.job_token(job_id), token)

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            batch: list[Command] = []
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
                self.run_batch(batch)
            if stop or time.time() >= self.next_tick_at():
                try:
                    self.tick()
                except Exception:
                    log.exception("control loop tick failed; state was rebuilt from the database")
            if stop:
                return

    def next_tick_at(self) -> float:
        """When the tick is due: every `tick_s`, sooner when a change awaits its cycle (there
        are nodes to run one on) and at once when the engine must be rebuilt. Not after every
        batch: under a stream of submissions that was a second transaction, a backend poll and
        a health check per commit, more CPU than the submissions themselves."""
        if self.state.rebuild:
            return 0.0
        due = self._last_tick + self.cfg.tick_s
        if self.state.changed and self.state.sched is not None:
            due = min(due, self._last_cycle + self.cfg.cycle_interval_s)
        return due

    def _timeout(self) -> float:
        return min(self.cfg.tick_s, max(0.0, self.next_tick_at() - time.time()))

    def now(self) -> float:
        """The loop's time: `clock`, never going back (a clock stepped back by NTP must not
        make a job end before it started)."""
        self._last_now = max(self._last_now, self.clock())
        return self._last_now

    def transaction(self, work: Callable[[Tx], Any]) -> Any:
        """`work(tx)` in one database transaction at `now()`, the books flushed with it and the
        backend actions it queued run after the commit; on failure the state is rebuilt from
        the database and the error raised."""
        tx = None
        try:
            with self.connection() as conn:
                tx = Tx(conn, self.now())
                out = work(tx)
                tx.flush()
                self.accounts.flush(conn)
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
    def connection(self) -> Iterator[Connection]:
        """A transaction on the loop's own connection, kept from one transaction to the next:
        taking one from the pool for each batch cost a round trip to PostgreSQL per batch (the
        pool's liveness ping). One the database has dropped is replaced before it is used."""
        if self._conn is None:
            self._conn = self.db.connect()
        elif dropped(self._conn):
            self._conn.invalidate()  # the next use takes a new one from the pool
        with self._conn.begin():
            yield self._conn

    def run_batch(self, batch: list[Command]) -> None:
        """Run a batch of commands in one transaction. Should it fail (a bug, a database
        error), the state has been rebuilt from the database and each command is run again in
        a transaction of its own, so a bad command fails alone, never its neighbours."""
        submit = self.commands.submit

        def work(tx: Tx) -> list[Any]:
            results: list[Any] = []
            for cmd in batch:
                if cmd.fn != submit:
                    tx.flush()  # the command may read or change rows submitted before it
                try:
                    results.append(cmd.fn(tx, *cmd.args))
                except ArbiterError as e:
                    results.append(e)
            return results

        try:
            results = self.transaction(work)
        except Exception as e:
            if len(batch) > 1:
                log.warning(
                    "a batch of %d requests failed (%s); running them one by one", len(batch), e
                )
                for cmd in batch:
                    self.run_batch([cmd])
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
            self.load()
        except Exception:
            log.exception("rebuilding from the database failed")

    def load(self) -> None:
        """(Re)build all in-memory state from the database, then reconcile with the backend
        (`rebuild.py`)."""
        with self.connection() as conn:
            tx = Tx(conn, self.now())
            self.rebuild.load(tx)
            tx.flush()
            self.accounts.flush(conn)
        for action in tx.after:
            action()

    # -- the tick: backend events, health, budgets, the cycle ------------------------------

    def tick(self) -> None:
        """One tick in a transaction of its own (what the thread runs when `next_tick_at` is
        due)."""
        try:
            self.transaction(self._tick)
        finally:
            self._last_tick = time.time()

    def _tick(self, tx: Tx) -> None:
        now, st = tx.now, self.state
        self.apply.backend_events(tx)
        if st.rebuild:
            self.rebuild.build(tx)
        for verdict in st.monitor.check(now):
            node = st.nodes.get(verdict.node)
            if node is not None and node["state"] in IN_SERVICE:
                self.apply.node_down(tx, verdict.node, "down", verdict.reason, SCHEDULER)
        if self.accounts.budgets.budgets:
            if self.accounts.budgets.open_period(now):
                st.changed = True
        if now - self.accounts.last_accrual >= 1.0:
            if self.accounts.accrue(now, st.live):
                self.apply.exhausted(tx)
        if st.draining:
            if self.on_drained is not None and not (st.sched and st.sched.running):
                tx.after.append(self.on_drained)
                self.on_drained = None
            return
        if st.sched is None:
            return
        self.apply.move_off_degraded(tx)
        due = st.changed and now - self._last_cycle >= self.cfg.cycle_interval_s
        if due or now >= self._wakeup or now - self._last_cycle >= self.cfg.idle_cycle_s:
            self._cycle(tx)
        if now - self._last_observed >= 1.0:
            observe(st, self.accounts, self.metrics, self.last_cycle_result)
            self._last_observed = now

    def _cycle(self, tx: Tx) -> None:
        assert self.state.sched is not None
        t0 = time.perf_counter()
        result = self.state.sched.cycle(tx.now)
        self.metrics.cycle.observe(time.perf_counter() - t0)
        self._last_cycle = tx.now
        self.state.changed = False
        self._wakeup = result.next_wakeup if result.next_wakeup is not None else math.inf
        self.last_cycle_result = result
        for d in result.decisions:
            self.apply.decision(tx, d)
