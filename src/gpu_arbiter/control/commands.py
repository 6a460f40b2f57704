"""What each API request that changes something does, run on the loop's thread inside the
batch's transaction: queue or cancel a job, drain the server, set teams, tokens and prices,
register nodes, take heartbeats and telemetry.

Each command checks everything it needs before it changes anything, so a refused one (an
`ArbiterError`) leaves no trace in the batch it shares. Separate from the loop, which decides
when commands run and commits them, and from `apply`, through which a command changes a job
the same way a decision or a backend event does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sqlalchemy import delete, insert, select, update

from gpu_arbiter.backends.base import Backend
from gpu_arbiter.control.accounting import Accounts
from gpu_arbiter.control.apply import Applier
from gpu_arbiter.control.auth import Authenticator, Forbidden, Principal, hash_token, new_token
from gpu_arbiter.control.errors import Conflict, NotFound, Unavailable
from gpu_arbiter.control.jobrows import (
    ACTIVE,
    LiveJob,
    job_row,
    set_job,
    spec_from_request,
    submitted_row,
)
from gpu_arbiter.control.metrics import Metrics
from gpu_arbiter.control.schemas import Heartbeat, JobSubmit, NodeRegister, TeamPut, Telemetry
from gpu_arbiter.control.state import LoopState, Tx
from gpu_arbiter.control.store import (
    JOBS,
    NODES,
    TEAMS,
    TELEMETRY,
    TOKENS,
    put_setting,
    set_node,
)
from gpu_arbiter.domain import GPU_CATALOG, InvalidInput, Node, Team
from gpu_arbiter.domain.team import check_quotas
from gpu_arbiter.economy import ChargeModel, PriceTable
from gpu_arbiter.reliability.health import HealthReport


class Commands:
    """The handlers the API hands the loop (`ControlLoop.run(loop.commands.submit, ...)`);
    each takes the batch's transaction first."""

    def __init__(
        self,
        st: LoopState,
        accounts: Accounts,
        apply: Applier,
        backend: Backend,
        auth: Authenticator | None,
        metrics: Metrics,
    ) -> None:
        self.st = st
        self.accounts = accounts
        self.apply = apply
        self.backend = backend
        self.auth = auth
        self.metrics = metrics

    # -- jobs ------------------------------------------------------------------------------

    def submit(
        self, tx: Tx, who: Principal, req: JobSubmit, key: str | None, request_hash: str
    ) -> tuple[dict[str, Any], bool]:
        """Queue a job; returns its row and whether it is new. A repeated idempotency key
        returns the job it created the first time."""
        st = self.st
        team = self._team_for(who, req.team)
        key = key or req.client_key
        if key is not None and (team, key) in st.keys:
            job_id, first_hash = st.keys[(team, key)]
            if first_hash != request_hash:
                raise Conflict(
                    f"Idempotency-Key {key!r} was already used for job {job_id} with a "
                    "different request"
                )
            if job_id in tx.new_jobs:
                return dict(tx.new_jobs[job_id]), False
            return job_row(tx.conn, job_id), False
        if st.sched is None:
            raise Unavailable("no GPU nodes are registered yet")
        if st.draining:
            raise Unavailable("the server is draining: it takes no new jobs before it stops")
        seq = st.next_seq
        job_id = f"j{seq}"
        spec = spec_from_request(job_id, team, req, tx.now)
        job = st.sched.submit(spec, tx.now)
        st.next_seq += 1
        if key is not None:
            st.keys[(team, key)] = (job_id, request_hash)
        row = submitted_row(seq, spec, req, int(job.tier), key, request_hash, tx.now)
        tx.new_jobs[job_id] = row
        st.live[job_id] = LiveJob(seq, spec, req.command, dict(req.env), tx.now, int(job.tier))
        tx.audit(who.actor, "submit", job_id, tier=int(spec.tier), gpus=spec.gpus)
        self.metrics.submissions.labels(str(int(spec.tier))).inc()
        st.changed = True
        return row, True

    def cancel(self, tx: Tx, who: Principal, job_id: str) -> dict[str, Any]:
        row = job_row(tx.conn, job_id)
        if not who.may_act_for(row["team"]):
            raise NotFound(f"job {job_id} not found")
        if row["state"] not in ACTIVE:
            raise Conflict(f"job {job_id} is already {row['state']}")
        was_running = row["state"] == "running"
        sched = self.st.sched
        if sched is not None and job_id in sched.jobs:
            sched.cancel(job_id, tx.now)
        self.apply.end(
            tx, job_id, "cancelled", f"cancelled by {who.actor}", stop=was_running, actor=who.actor
        )
        self.st.changed = True
        return job_row(tx.conn, job_id)

    def telemetry(self, tx: Tx, job_id: str, data: Telemetry) -> dict[str, Any]:
        st = self.st
        live = st.live.get(job_id)
        if live is None:
            raise Conflict(f"job {job_id} is not active")
        job = st.sched.running.get(job_id) if st.sched is not None else None
        if data.node is not None and job is not None:
            assert st.sched is not None
            # A job may speak only for its own nodes: a step time is what marks a node degraded.
            names = [st.sched.cluster.nodes[n].name for n in job.allocation.nodes]
            if data.node not in names:
                raise InvalidInput(
                    f"node: job {job_id} runs on {', '.join(names)}, not on {data.node!r}"
                )
        doc = data.data()
        if data.checkpoint_at is not None or data.event == "checkpoint":
            live.last_checkpoint_at = data.checkpoint_at or tx.now
            if st.sched is not None:
                st.sched.sdk_checkpoints.add(job_id)
        tx.conn.execute(insert(TELEMETRY).values(job_id=job_id, at=tx.now, data=doc))
        set_job(
            tx.conn,
            job_id,
            telemetry={**doc, "at": tx.now},
            last_checkpoint_at=live.last_checkpoint_at,
        )
        if job is not None:
            trip, straggler = st.watch.observe(job_id, job.team, tx.now, data)
            if trip is not None:
                self.apply.tripped(tx, trip)
            if straggler is not None and job_id in st.live:
                self.apply.straggler(tx, straggler, job.team)
        return {"job_id": job_id, "at": tx.now}

    def drain(self, tx: Tx, who: Principal, grace_s: float | None) -> dict[str, Any]:
        """Stop for good (admin): no job starts any more, every running job is stopped with the
        notice of its tier (a preemption's; at most `grace_s` when given) and queued again, and
        once none runs the server exits (`ControlLoop.on_drained`). Nothing is lost: the queue
        waits in the database for the next start. (A plain stop or crash instead leaves jobs
        running for the next start to adopt.)"""
        who.require_admin()
        self.st.draining = True
        stopping = []
        sched = self.st.sched
        if sched is not None:
            for job_id, job in sched.running.items():
                grace = sched.notice_of_tier(job.tier)
                if grace_s is not None:
                    grace = min(grace, grace_s)
                set_job(tx.conn, job_id, preempting=True, reason="the server is draining")
                tx.after.append(lambda j=job_id, g=grace: self.backend.stop(j, g))
                stopping.append(job_id)
        tx.audit(who.actor, "drain", "server", grace_s=grace_s, stopping=stopping)
        return {"draining": True, "stopping": stopping}

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
        if team not in self.st.teams:
            raise InvalidInput(f"team: unknown team {team!r}")
        return team

    # -- teams, tokens, prices -------------------------------------------------------------

    def put_team(self, tx: Tx, who: Principal, name: str, req: TeamPut) -> dict[str, Any]:
        who.require_admin()
        st = self.st
        team = Team(name, req.weight, dict(req.quota), req.budget_per_period)
        others = [t for n, t in st.teams.items() if n != name]
        if st.sched is not None:
            check_quotas([*others, team], st.sched.cluster.gpus_by_type())
        values = {
            "weight": team.weight,
            "quota": dict(team.quota),
            "budget_per_period": team.budget_per_period,
            "breaker_policy": req.breaker_policy,
            "webhook_url": str(req.webhook_url) if req.webhook_url is not None else None,
            "run_as": req.run_as,
        }
        if name in st.teams:
            tx.conn.execute(update(TEAMS).where(TEAMS.c.name == name).values(**values))
        else:
            tx.conn.execute(insert(TEAMS).values(name=name, **values))
        st.teams[name] = team
        st.watch.set_team(name, req.breaker_policy, values["webhook_url"])
        if req.run_as:
            st.run_as[name] = req.run_as
        else:
            st.run_as.pop(name, None)
        tx.audit(who.actor, "team-set", name, **values)
        st.rebuild = True
        return {"name": name, **values}

    def delete_team(self, tx: Tx, who: Principal, name: str) -> dict[str, Any]:
        """Remove a team that has no active jobs. Its tokens are revoked with it, so a team
        made again under the name starts with none; its ledger entries stay (bills are
        history)."""
        who.require_admin()
        st = self.st
        if name not in st.teams:
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
        del st.teams[name]
        st.run_as.pop(name, None)
        if self.auth is not None:
            auth = self.auth
            for token_id in revoked:
                tx.after.append(lambda t=token_id: auth.forget(t))
        tx.audit(who.actor, "team-delete", name, tokens_revoked=revoked)
        st.rebuild = True
        return {"name": name, "tokens_revoked": revoked}

    def create_token(
        self, tx: Tx, who: Principal, role: str, team: str | None, label: str
    ) -> dict[str, Any]:
        who.require_admin()
        if role == "team":
            if team is None:
                raise InvalidInput("team: a team token needs a team")
            if team not in self.st.teams:
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
        tx.audit(who.actor, "token-create", f"token#{token_id}", role=role, team=team)
        return {"id": token_id, "role": role, "team": team, "label": label, "token": token}

    def revoke_token(self, tx: Tx, who: Principal, token_id: int) -> dict[str, Any]:
        who.require_admin()
        found = tx.conn.execute(
            update(TOKENS)
            .where(TOKENS.c.id == token_id, TOKENS.c.revoked_at.is_(None))
            .values(revoked_at=tx.now)
        )
        if found.rowcount == 0:
            raise NotFound(f"token {token_id} does not exist or is already revoked")
        if self.auth is not None:
            auth = self.auth
            tx.after.append(lambda: auth.forget(token_id))
        tx.audit(who.actor, "token-revoke", f"token#{token_id}")
        return {"id": token_id, "revoked_at": tx.now}

    def put_prices(self, tx: Tx, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
        who.require_admin()
        table = PriceTable.from_dict(body, source="prices")
        stored = {
            "on_demand": _str_keys(table.on_demand),
            "preemptible": _str_keys(table.preemptible),
            "gpu_multipliers": dict(table.gpu_multipliers),
            "default_multiplier": table.default_multiplier,
            "credit_value": table.credit_value,
            "currency": table.currency,
        }
        put_setting(tx.conn, "prices", stored)
        self.accounts.charges = ChargeModel(table)
        tx.audit(who.actor, "prices-set", "prices", **stored)
        return stored

    # -- nodes -----------------------------------------------------------------------------

    def register_node(self, tx: Tx, who: Principal, name: str, req: NodeRegister) -> dict[str, Any]:
        if who.role not in ("admin", "agent"):
            raise Forbidden("registering nodes needs an admin or agent token")
        _check_name(name, "node")
        st = self.st
        spec = {"gpu_type": req.gpu_type, "gpus": req.gpus, "rack": req.rack}
        Node(name, req.gpu_type, req.gpus, req.rack)  # validates
        old = st.nodes.get(name)
        if old is not None and {k: old[k] for k in spec} != spec:
            sched = st.sched
            busy = sched is not None and any(
                name in (sched.cluster.nodes[n].name for n in j.allocation.nodes)
                for j in sched.running.values()
            )
            if busy:
                raise Conflict(f"node {name} runs jobs; drain it before changing its GPUs")
            if sched is not None:
                capacity = sched.cluster.gpus_by_type()
                capacity[old["gpu_type"]] -= old["gpus"]
                capacity[req.gpu_type] = capacity.get(req.gpu_type, 0) + req.gpus
                check_quotas(list(st.teams.values()), capacity)
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
            st.nodes[name] = row
            tx.audit(who.actor, "node-register", name, **spec)
            st.rebuild = True
        elif {k: old[k] for k in spec} != spec:
            set_node(tx.conn, name, **spec)
            old.update(spec)
            tx.audit(who.actor, "node-change", name, **spec)
            st.rebuild = True
        if old is not None:
            # Registering again is a sign of life: on Slurm and Kubernetes the executor's node
            # poll does it for every healthy node, and it is their only heartbeat.
            old["last_heartbeat"] = tx.now
            set_node(tx.conn, name, last_heartbeat=tx.now)
        st.monitor.heartbeat(name, tx.now)
        if st.nodes[name]["state"] == "down" and "missed heartbeats" in st.nodes[name]["reason"]:
            self.apply.node_up(tx, name, who.actor)
        return dict(st.nodes[name])

    def heartbeat(self, tx: Tx, who: Principal, name: str, hb: Heartbeat) -> dict[str, Any]:
        if who.role not in ("admin", "agent"):
            raise Forbidden("heartbeats need an admin or agent token")
        node = self.st.nodes.get(name)
        if node is None:
            raise NotFound(f"node {name!r} is not registered")
        health = hb.model_dump(exclude_none=True)
        self.st.monitor.report(
            name,
            tx.now,
            HealthReport(tuple(hb.xids), hb.ecc_uncorrectable, hb.nvlink_down, hb.temperature_c),
        )
        if node["state"] == "down" and "missed heartbeats" in node["reason"]:
            self.apply.node_up(tx, name, who.actor)
        node.update(last_heartbeat=tx.now, health=health)
        set_node(tx.conn, name, last_heartbeat=tx.now, health=health)
        return {"name": name, "state": node["state"]}

    def node_state(
        self, tx: Tx, who: Principal, name: str, up: bool, reason: str
    ) -> dict[str, Any]:
        who.require_admin()
        node = self.st.nodes.get(name)
        if node is None:
            raise NotFound(f"node {name!r} is not registered")
        if up and node["state"] != "up":
            self.apply.node_up(tx, name, who.actor)
        elif not up and node["state"] == "up":
            reason = reason or f"cordoned by {who.actor}"
            self.apply.node_down(tx, name, "cordoned", reason, who.actor)
        return dict(node)


def _check_name(name: str, what: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", name):
        raise InvalidInput(f"{what}: name {name!r} must be letters, digits, '.', '_' or '-'")


def _str_keys(d: Mapping[int, float]) -> dict[str, float]:
    return {str(k): v for k, v in d.items()}
