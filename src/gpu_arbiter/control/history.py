"""The cluster's own history as a trace: every job the service has seen, and what became of it.

`history_lines(db, since)` reads the database (jobs, audit log, ledger, nodes, teams, prices)
and yields the lines of an `arbiter-history` JSON-lines file (format: docs/history-format.md):
first a header with the cluster, teams and prices in force, then one line per job in order of
submission. The API streams them (GET /v1/history, admin) and `arbiter history export --db`
writes them from a database directly, so both give the same file.

Run segments come from the audit log, which records every start, resize, requeue and end of a
job with its time; the ledger says how much of each segment was lost to a failure (its "rerun"
and "lost-work" charges), so a replay can run a job for the work it kept.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection, Engine

from gpu_arbiter.control.store import TABLES
from gpu_arbiter.domain.cluster import GPU_CATALOG
from gpu_arbiter.economy.chargeback import LOST_WORK, RERUN
from gpu_arbiter.economy.ledger import CHARGE

FORMAT = "arbiter-history"
VERSION = 1

JOBS, AUDIT, LEDGER = TABLES["jobs"], TABLES["audit"], TABLES["ledger"]
NODES, TEAMS, SETTINGS = TABLES["nodes"], TABLES["teams"], TABLES["settings"]
TELEMETRY = TABLES["telemetry"]

# Audit actions that end a job; "cancel" is how a cancellation is recorded.
_ENDS = {"completed": "completed", "failed": "failed", "cancel": "cancelled"}
_SPEED = ("tokens_per_s", "step_time_s", "flops")
_BATCH = 500  # jobs read per query: memory stays flat however long the history


def history_lines(
    db: Engine, since: float | None = None, policy: str | None = None
) -> Iterator[dict[str, Any]]:
    """The header, then one record per job submitted at or after `since` (epoch seconds)."""
    with db.connect() as conn:
        node_types = {r.name: r.gpu_type for r in conn.execute(select(NODES))}
        yield header(conn, since, policy)
        last = -1
        while True:
            q = select(JOBS).where(JOBS.c.seq > last).order_by(JOBS.c.seq).limit(_BATCH)
            if since is not None:
                q = q.where(JOBS.c.submitted_at >= since)
            rows = list(conn.execute(q).mappings())
            if not rows:
                return
            ids = [r["id"] for r in rows]
            audit = _by_subject(
                conn.execute(
                    select(AUDIT.c.subject, AUDIT.c.at, AUDIT.c.action, AUDIT.c.detail)
                    .where(AUDIT.c.subject.in_(ids))
                    .order_by(AUDIT.c.id)
                )
            )
            lost = _lost(conn, ids)
            for row in rows:
                yield job_record(row, audit.get(row["id"], []), lost.get(row["id"], []), node_types)
            last = rows[-1]["seq"]


def header(conn: Connection, since: float | None, policy: str | None) -> dict[str, Any]:
    """What was in force: the cluster (in the YAML cluster format), teams and prices."""
    nodes = list(conn.execute(select(NODES).order_by(NODES.c.name)).mappings())
    racks: dict[str, list[dict[str, Any]]] = {}
    for n in nodes:
        racks.setdefault(n["rack"], []).append(
            {"name": n["name"], "gpu_type": n["gpu_type"], "gpus": n["gpus"]}
        )
    types = sorted({n["gpu_type"] for n in nodes})
    prices = conn.execute(select(SETTINGS.c.value).where(SETTINGS.c.key == "prices")).first()
    return {
        "format": FORMAT,
        "version": VERSION,
        "exported_at": time.time(),
        "since": since,
        "policy": policy,
        "cluster": {
            "name": "history",
            "gpu_types": [
                {
                    "name": t,
                    "speed": GPU_CATALOG[t].speed,
                    "power_w": GPU_CATALOG[t].power_w,
                    "memory_gib": GPU_CATALOG[t].memory_gib,
                }
                for t in types
                if t in GPU_CATALOG
            ],
            "racks": [{"name": r, "nodes": ns} for r, ns in sorted(racks.items())],
        },
        "node_states": {n["name"]: n["state"] for n in nodes},
        "teams": [
            {
                "name": t["name"],
                "weight": t["weight"],
                "quota": dict(t["quota"] or {}),
                "budget": t["budget_per_period"],
            }
            for t in conn.execute(select(TEAMS).order_by(TEAMS.c.name)).mappings()
        ],
        "prices": None if prices is None else prices.value,
    }


def job_record(
    row: Mapping[str, Any],
    audit: list[tuple[float, str, dict[str, Any]]],
    lost: list[tuple[float, float]],
    node_types: Mapping[str, str],
) -> dict[str, Any]:
    """One job: its spec, its run segments and how it ended."""
    spec = row["spec"]
    segments = _segments(audit, row, node_types)
    for seg in segments:
        end = seg["end"] if seg["end"] is not None else float("inf")
        seg["lost_s"] = sum(b - a for a, b in lost if seg["start"] <= a < end)
    telemetry = row["telemetry"] or {}
    return {
        "id": row["id"],
        "team": row["team"],
        "name": row["name"],
        "tier_requested": spec["tier"],
        "tier_given": row["tier"],
        "gpus": spec["gpus"],
        "min_gpus": spec.get("min_gpus"),
        "max_gpus": spec.get("max_gpus"),
        "gpu_types": dict(spec["gpu_types"]),
        "walltime_s": spec.get("walltime_s"),
        "checkpoint_interval_s": spec.get("checkpoint_interval_s"),
        "gpu_milli": spec.get("gpu_milli", 1000),
        "kind": spec.get("kind", "training"),
        "submitted_at": row["submitted_at"],
        "first_start": row["first_start"],
        "finished_at": row["finished_at"],
        "state": row["state"],
        "reason": row["reason"],
        "exit_code": row["exit_code"],
        "preemptions": row["preemptions"],
        "restarts": row["restarts"],
        "segments": segments,
        # What the job last reported of its speed (F4), when it reported any.
        "throughput": {k: telemetry[k] for k in _SPEED if telemetry.get(k) is not None} or None,
    }


def _segments(
    audit: list[tuple[float, str, dict[str, Any]]],
    row: Mapping[str, Any],
    node_types: Mapping[str, str],
) -> list[dict[str, Any]]:
    """Run segments from the job's audit trail: a start (or resize) opens one, the next
    resize, requeue or end closes it; one still open has `end` null."""
    out: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None

    def close(at: float, how: str) -> None:
        nonlocal current
        if current is not None:
            current["end"] = max(at, current["start"])
            current["ended"] = how
            out.append(current)
            current = None

    for at, action, detail in audit:
        if action in ("start", "resize"):
            close(at, "resize")
            nodes = detail.get("allocation") or {}
            kinds = {node_types.get(n) for n in nodes}
            current = {
                "start": at,
                "end": None,
                "gpu_type": next(iter(kinds)) if len(kinds) == 1 else None,
                "gpus": sum(len(g) for g in nodes.values()),
                "ended": "running",
            }
        elif action == "requeue":
            reason = str(detail.get("reason", ""))
            close(at, "preempted" if "preempt" in reason else "requeued: " + reason)
        elif action in _ENDS:
            finished = row["finished_at"]
            close(at if finished is None else finished, _ENDS[action])
    if current is not None:
        out.append(current)
    return out


def _by_subject(rows: Any) -> dict[str, list[tuple[float, str, dict[str, Any]]]]:
    out: dict[str, list[tuple[float, str, dict[str, Any]]]] = {}
    for subject, at, action, detail in rows:
        out.setdefault(subject, []).append((at, action, detail or {}))
    return out


def _lost(conn: Connection, ids: list[str]) -> dict[str, list[tuple[float, float]]]:
    """Each job's intervals of work lost to failures, from the ledger's charges for them."""
    q = select(LEDGER.c.job_id, LEDGER.c.entry).where(
        LEDGER.c.job_id.in_(ids), LEDGER.c.kind == CHARGE
    )
    out: dict[str, list[tuple[float, float]]] = {}
    for job_id, entry in conn.execute(q):
        if entry.get("reason") in (RERUN, LOST_WORK):
            out.setdefault(job_id, []).append((entry["start"], entry["end"]))
    return out


def history_ndjson(
    db: Engine, since: float | None = None, policy: str | None = None
) -> Iterator[bytes]:
    """The history as JSON lines, for streaming or writing to a file."""
    for line in history_lines(db, since, policy):
        yield (json.dumps(line, sort_keys=False) + "\n").encode()
