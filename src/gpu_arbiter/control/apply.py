"""How the engine's decisions and the backend's events become rows, charges and backend calls.

A start, a preemption, a resize, a job that finished, failed, was lost or could not launch, a
node that went down or came back, a tripped circuit breaker, a straggler, a spent budget: each
is written here to the job's and node's rows, the audit log and the books (`accounting`), and
what the backend must do is queued to run once the transaction commits. The commands, the
tick and the rebuild all change jobs through these methods, so a job ends, or goes back to the
queue, the same way whoever asked.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sqlalchemy import func

from gpu_arbiter.backends.base import Backend, Placement
from gpu_arbiter.control.accounting import Accounts
from gpu_arbiter.control.config import ServerConfig
from gpu_arbiter.control.jobrows import LiveJob, allocation_of, ended, requeued, set_job
from gpu_arbiter.control.metrics import Metrics
from gpu_arbiter.control.notify import Webhooks
from gpu_arbiter.control.state import IN_SERVICE, SCHEDULER, LoopState, Tx
from gpu_arbiter.control.store import JOBS, set_node
from gpu_arbiter.domain import Allocation, JobFinished, JobStopped, Preempt, Resize, Start
from gpu_arbiter.domain.events import (
    JobFailed,
    JobLaunchFailed,
    JobLost,
    JobPlaced,
    NodeDown,
    NodeUp,
)
from gpu_arbiter.reliability import Action, Trip, gpu_s_saved_by_stop
from gpu_arbiter.reliability.stragglers import Straggler

log = logging.getLogger("gpu_arbiter.control")


class Applier:
    """Applies decisions and events to the loop's state (`LoopState`), its books and the
    database, and queues the backend's part for after the commit."""

    def __init__(
        self,
        st: LoopState,
        accounts: Accounts,
        backend: Backend,
        cfg: ServerConfig,
        metrics: Metrics,
        webhooks: Webhooks,
    ) -> None:
        self.st = st
        self.accounts = accounts
        self.backend = backend
        self.cfg = cfg
        self.metrics = metrics
        self.webhooks = webhooks
        # Starts the backend refused after their commit, handled on the next tick.
        self.launch_failures: list[JobLaunchFailed] = []

    # -- the engine's decisions ------------------------------------------------------------

    def decision(self, tx: Tx, d: Any) -> None:
        if isinstance(d, Start):
            self._start(tx, d)
        elif isinstance(d, Preempt):
            self._preempt(tx, d)
        elif isinstance(d, Resize):
            self._resize(tx, d)

    def _start(self, tx: Tx, d: Start) -> None:
        sched = self.st.sched
        assert sched is not None
        job = sched.jobs[d.job_id]
        live = self.st.live[d.job_id]
        self.st.watch.forget(d.job_id)  # a new run is watched afresh
        values, placement = self._place(tx, d.job_id, d.allocation, d.borrowed)
        set_job(
            tx.conn,
            d.job_id,
            state="running",
            preempting=False,
            tier=int(job.tier),
            started_at=tx.now,
            first_start=func.coalesce(JOBS.c.first_start, tx.now),
            reason="",
            **values,
        )
        if job.first_start == tx.now and job.preemptions == 0 and job.restarts == 0:
            self.metrics.queue_delay.labels(str(int(job.spec.tier))).observe(
                tx.now - live.submitted_at
            )
        by_node = values["allocation"]["nodes"]
        tx.audit(SCHEDULER, "start", d.job_id, allocation=by_node, borrowed=d.borrowed)
        tx.after.append(lambda: self._launch(placement))

    def _launch(self, placement: Placement) -> None:
        """Hand a committed start to the backend; one it refuses fails the job on the next
        tick (`JobLaunchFailed`) instead of leaving it running with no process."""
        try:
            self.backend.start(placement)
        except Exception as e:
            log.warning("job %s could not be started: %s", placement.job_id, e)
            why = str(e) or type(e).__name__
            self.launch_failures.append(JobLaunchFailed(placement.job_id, time.time(), why))

    def _preempt(self, tx: Tx, d: Preempt) -> None:
        assert self.st.sched is not None
        job = self.st.sched.jobs[d.job_id]
        self.metrics.preemptions.labels(str(int(job.tier))).inc()
        tx.audit(
            SCHEDULER, "preempt", d.job_id, grace_s=d.grace_s, reason=d.reason, for_job=d.for_job
        )
        if d.grace_s > 0:
            set_job(
                tx.conn,
                d.job_id,
                preempting=True,
                preemptions=JOBS.c.preemptions + 1,
                reason=d.reason,
            )
            tx.after.append(lambda: self.backend.stop(d.job_id, d.grace_s))
            return
        # Grace 0: the engine has already queued the job again.
        self.close_segment(tx, d.job_id)
        set_job(tx.conn, d.job_id, **requeued(d.reason), preemptions=JOBS.c.preemptions + 1)
        tx.after.append(lambda: self.backend.stop(d.job_id, 0.0))

    def _resize(self, tx: Tx, d: Resize) -> None:
        assert self.st.sched is not None
        job = self.st.sched.jobs[d.job_id]
        self.close_segment(tx, d.job_id)
        values, placement = self._place(tx, d.job_id, d.allocation, job.borrowed)
        set_job(tx.conn, d.job_id, **values)
        by_node = values["allocation"]["nodes"]
        tx.audit(SCHEDULER, "resize", d.job_id, allocation=by_node, reason=d.reason)
        tx.after.append(lambda: self.backend.resize(placement))

    def _place(
        self, tx: Tx, job_id: str, alloc: Allocation, borrowed: bool
    ) -> tuple[dict[str, Any], Placement]:
        """A job now holds `alloc` (a start or a resize): open its run segment, and return the
        job row's allocation and segment columns and what the backend is to run where."""
        sched = self.st.sched
        assert sched is not None
        job = sched.jobs[job_id]
        live = self.st.live[job_id]
        by_node = {sched.cluster.nodes[n].name: list(g) for n, g in alloc.slots}
        self.accounts.open(job_id, tx.now, alloc.gpu_type, alloc.gpus, job.tier, borrowed)
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
            run_as=self.st.run_as.get(job.team),
        )
        return values, placement

    def _job_env(self, job_id: str, live: LiveJob, tier: int) -> dict[str, str]:
        return {
            **live.env,
            "ARBITER_URL": self.cfg.public_url,
            "ARBITER_JOB_TOKEN": self.st.job_token(job_id),
            "ARBITER_TEAM": live.spec.team,
            "ARBITER_TIER": str(int(tier)),
            "ARBITER_CHECKPOINT_DIR": str(self.cfg.work_root / job_id / "checkpoints"),
        }

    # -- the backend's events --------------------------------------------------------------

    def backend_events(self, tx: Tx) -> None:
        """What the backend reported since the last tick: the starts it refused, then what
        its poll says."""
        failed, self.launch_failures = self.launch_failures, []
        for event in [*failed, *self.backend.poll()]:
            self.event(tx, event)

    def event(self, tx: Tx, event: Any) -> None:
        if isinstance(event, NodeDown | NodeUp):
            self._backend_node(tx, event)
            return
        sched = self.st.sched
        if sched is None or event.job_id not in sched.running:
            return  # stale: the engine already queued it again (grace-0 stop, cancel)
        self.st.changed = True
        job_id = event.job_id
        if isinstance(event, JobStopped):
            sched.stopped(job_id, tx.now)
            draining = self.st.draining
            why = "stopped: the server was drained" if draining else "stopped after preemption"
            self.requeue(tx, job_id, why)
        elif isinstance(event, JobFinished):
            sched.finished(job_id, tx.now)
            self.end(tx, job_id, "completed", "", exit_code=0, at=event.at)
        elif isinstance(event, JobFailed):
            sched.finished(job_id, tx.now)
            self.end(
                tx,
                job_id,
                "failed",
                f"exited with code {event.exit_code}",
                exit_code=event.exit_code,
                at=event.at,
            )
        elif isinstance(event, JobLost):
            lost_from = self.lost_from(job_id)
            sched.lost(job_id, tx.now)
            reason = f"node failure: {event.reason}"
            self.requeue(tx, job_id, reason, lost_from=lost_from, restart=True, at=event.at)
            log.warning("job %s requeued from its checkpoint: %s", job_id, reason)
        elif isinstance(event, JobLaunchFailed):
            sched.finished(job_id, tx.now)
            self.never_ran(tx, job_id, event.reason)
        elif isinstance(event, JobPlaced):
            self._placed(tx, event)

    def _backend_node(self, tx: Tx, event: NodeDown | NodeUp) -> None:
        """The executor's own view of a node (Slurm drained it, or returned it to service). A
        node is taken back up only from a fault this executor reported (its reason starts with
        the executor's name), never from a cordon or a failed health check."""
        node = self.st.nodes.get(event.node)
        if node is None:
            return  # not registered: registration comes from the executor's inventory
        name = self.backend.name
        if isinstance(event, NodeDown):
            if node["state"] in IN_SERVICE:
                self.node_down(tx, event.node, "down", event.reason, name)
        elif node["state"] == "down" and node["reason"].startswith(f"{name}:"):
            self.node_up(tx, event.node, name)

    def _placed(self, tx: Tx, event: JobPlaced) -> None:
        """The executor put the job on other GPU indices of its nodes than the engine chose:
        record them in the engine's books and as the job's allocation, or neither."""
        sched = self.st.sched
        assert sched is not None
        job = sched.jobs[event.job_id]
        nodes = {n: list(g) for n, g in event.gpus_by_node}
        data = {"gpu_type": job.allocation.gpu_type, "nodes": nodes}
        alloc = allocation_of(sched.cluster, data)
        if alloc is None or not sched.move_gpus(event.job_id, alloc):
            log.warning(
                "job %s: %s placed it on %s, not free in the engine's books",
                event.job_id,
                self.backend.name,
                nodes,
            )
            return
        set_job(tx.conn, event.job_id, allocation=data)
        tx.audit(self.backend.name, "placed", event.job_id, allocation=nodes)

    # -- a job stops holding GPUs ----------------------------------------------------------

    def requeue(
        self,
        tx: Tx,
        job_id: str,
        reason: str,
        stop: bool = False,
        lost_from: float | None = None,
        restart: bool = False,
        at: float | None = None,
    ) -> None:
        """The job holds nothing any more and waits in the queue (the engine already knows);
        its run is charged up to `at` (when the executor says it ended; default now)."""
        self.close_segment(tx, job_id, lost_from, at)
        values = requeued(reason)
        if restart:
            values["restarts"] = JOBS.c.restarts + 1
        sched = self.st.sched
        if sched is not None and job_id in sched.jobs:
            values["tier"] = int(sched.jobs[job_id].tier)
        set_job(tx.conn, job_id, **values)
        tx.audit(SCHEDULER, "requeue", job_id, reason=reason)
        if stop:
            tx.after.append(lambda: self.backend.stop(job_id, 0.0))

    def end(
        self,
        tx: Tx,
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
        end = self.close_segment(tx, job_id, at=at)
        set_job(tx.conn, job_id, **ended(state, reason, end, exit_code))
        live = self.st.live.pop(job_id, None)
        self.st.watch.forget(job_id)
        self.metrics.ended.labels(state).inc()
        if live is not None and state == "completed":
            self.metrics.jct.labels(str(int(live.spec.tier))).observe(end - live.submitted_at)
        action = state if state != "cancelled" else "cancel"
        tx.audit(actor, action, job_id, reason=reason, exit_code=exit_code)
        if stop:
            tx.after.append(lambda: self.backend.stop(job_id, 0.0))

    def never_ran(self, tx: Tx, job_id: str, why: str, actor: str = SCHEDULER) -> None:
        """A job whose command could not start fails, with the executor's error, and costs
        nothing: its run ends where it began, so what was accrued for it is refunded."""
        seg = self.accounts.segs.get(job_id)
        at = seg.start if seg is not None else None
        self.end(tx, job_id, "failed", f"could not start: {why}", actor=actor, at=at)

    def close_segment(
        self, tx: Tx, job_id: str, lost_from: float | None = None, at: float | None = None
    ) -> float:
        """Charge the job's run segment up to `at` (`Accounts.close`); returns the end used."""
        live = self.st.live.get(job_id)
        sched = self.st.sched
        keeps = None
        if sched is not None and job_id in sched.jobs:
            keeps = sched.checkpoints(sched.jobs[job_id])
        spec = live.spec if live is not None else None
        return self.accounts.close(job_id, spec, keeps, tx.now, lost_from, at)

    def lost_from(self, job_id: str) -> float | None:
        """Where a failure's lost work begins (`Accounts.lost_from`)."""
        return self.accounts.lost_from(job_id, self.st.live[job_id].last_checkpoint_at)

    # -- nodes -----------------------------------------------------------------------------

    def node_down(self, tx: Tx, name: str, state: str, reason: str, actor: str) -> None:
        sched = self.st.sched
        affected = sched.node_down(name, tx.now) if sched is not None else []
        for job_id in affected:
            lost_from = self.lost_from(job_id)
            self.requeue(tx, job_id, reason, stop=True, lost_from=lost_from, restart=True)
        self._set_node(tx, name, state=state, reason=reason)
        tx.audit(actor, f"node-{state}", name, reason=reason, requeued=affected)
        self.st.changed = True

    def node_up(self, tx: Tx, name: str, actor: str) -> None:
        if self.st.sched is not None:
            self.st.sched.node_up(name, tx.now)
        self.st.monitor.uncordon(name, tx.now)
        self._set_node(tx, name, state="up", reason="")
        tx.audit(actor, "node-up", name)
        self.st.changed = True

    def _set_node(self, tx: Tx, name: str, **values: Any) -> None:
        self.st.nodes[name].update(values)
        set_node(tx.conn, name, **values)

    # -- what telemetry and budgets bring about --------------------------------------------

    def tripped(self, tx: Tx, trip: Trip) -> None:
        """A circuit breaker tripped on a running job (F5): under the team's `stop` policy the
        job fails and its GPUs are released, under `flag` it runs on, flagged. Either way the
        reason is on the job, in the audit log and the metrics, and sent to the team."""
        sched = self.st.sched
        assert sched is not None
        job_id, breaker = trip.job_id, trip.detection.breaker.value
        self.metrics.breaker_trips.labels(breaker, trip.action.value).inc()
        saved_h = 0.0
        if trip.action is Action.STOP:
            # The GPU time it would still have held, counted as the simulator counts it.
            saved_h = gpu_s_saved_by_stop(sched.jobs[job_id], tx.now) / 3600
            sched.cancel(job_id, tx.now)
            self.end(tx, job_id, "failed", trip.reason, stop=True)
            self.metrics.breaker_saved_gpu_hours.inc(saved_h)
        else:
            set_job(tx.conn, job_id, reason=f"flagged by {trip.reason}")
        tx.audit(
            SCHEDULER,
            f"breaker-{trip.action.value}",
            job_id,
            breaker=breaker,
            step=trip.detection.step,
            reason=trip.reason,
            saved_gpu_hours=saved_h if trip.action is Action.STOP else None,
        )
        self.notify(tx, trip.team, f"Arbiter: {trip.message}")
        self.st.changed = True

    def straggler(self, tx: Tx, found: Straggler, team: str) -> None:
        """A node's ranks held a gang back: the node is marked degraded (it takes no new work,
        its jobs run on) and the team is told; the gang is restarted without it as soon as a
        healthy node is free (`move_off_degraded`)."""
        node = self.st.nodes.get(found.node)
        if node is None or node["state"] != "up" or self.st.sched is None:
            return  # not a node of ours, or already out of service
        self.st.sched.drain(found.node)
        self.st.degraded.add(found.node)
        self._set_node(tx, found.node, state="degraded", reason=found.reason)
        self.metrics.stragglers.inc()
        tx.audit(SCHEDULER, "node-degraded", found.node, reason=found.reason)
        self.notify(
            tx,
            team,
            f"Arbiter: node {found.node} marked degraded ({found.reason}); job "
            f"{found.job_id} restarts from its checkpoint without it when a healthy node is free",
        )
        self.st.changed = True
        self.move_off_degraded(tx)

    def move_off_degraded(self, tx: Tx) -> None:
        """Restart each multi-node job that runs on a degraded node from its checkpoint, once
        healthy GPUs of its type are free for the part it holds there (it is queued again,
        and the engine places it; a degraded node offers no GPUs)."""
        sched = self.st.sched
        if sched is None or not self.st.degraded:
            return
        for name in sorted(self.st.degraded):
            if self.st.nodes[name]["state"] != "degraded":
                self.st.degraded.discard(name)  # taken back up, or down since
                continue
            index = sched.cluster.node(name).index
            for job_id in sorted(sched.node_jobs[index]):
                job = sched.running.get(job_id)
                if job is None or job.allocation is None or len(job.allocation.nodes) < 2:
                    continue
                there = sum(len(g) for n, g in job.allocation.slots if n == index)
                if sched.index.type_free[job.allocation.gpu_type] < there:
                    continue
                lost_from = self.lost_from(job_id)
                sched.restart(job_id, tx.now)
                why = f"restarted without degraded node {name}"
                self.requeue(tx, job_id, why, stop=True, lost_from=lost_from, restart=True)
                self.st.changed = True

    def exhausted(self, tx: Tx) -> None:
        """Running jobs of a team that has spent its budget run at the tier an exhausted budget
        allows (E1, `BudgetPolicy.exhausted_tier`) from now on, as new ones are admitted: they
        become victims of that tier and are billed at its price in a new run segment."""
        sched, budgets = self.st.sched, self.accounts.budgets
        if sched is None or not budgets.budgets:
            return
        cap = budgets.policy.exhausted_tier
        broke = {t for t in budgets.budgets if not budgets.can_spend(t, tx.now)}
        if not broke:
            return
        for job_id, job in list(sched.running.items()):
            if job.team not in broke or job.tier >= cap or job_id not in self.accounts.segs:
                continue
            sched.demote(job_id, cap, tx.now)
            old = self.accounts.segs[job_id]
            self.close_segment(tx, job_id)
            self.accounts.open(job_id, tx.now, old.gpu_type, old.gpus, int(cap), job.borrowed)
            self.st.live[job_id].tier = int(cap)
            reason = f"budget of team {job.team} spent: runs at tier {int(cap)}"
            set_job(
                tx.conn,
                job_id,
                tier=int(cap),
                reason=reason,
                seg_start=tx.now,
                seg_tier=int(cap),
                seg_borrowed=job.borrowed,
            )
            tx.audit(SCHEDULER, "demote", job_id, tier=int(cap), reason=reason)
            self.st.changed = True

    def notify(self, tx: Tx, team: str, text: str) -> None:
        """Send `text` to the team's webhook, if it has one, once the transaction commits."""
        url = self.st.watch.webhooks.get(team)
        if url is not None:
            tx.after.append(lambda: self.webhooks.send(url, text))
