"""The dashboard's routes: pages at `/`, `/jobs/{id}` and `/reports`, JSON views under
`/ui/api/`, CSS and JS under `/ui/static/`.

Pages are HTML shells (no live data in them), so they need no token; the JSON views need the
same bearer token as the REST API, which the page's script keeps in the browser's local storage
(pasted once, or passed as `/#token=...`: a fragment never reaches the server or its logs).
Simulation reports are served without a token: they hold replayed workloads, not tenant data.

Engine state is copied on the control loop's thread (`web.snapshot`) at most once a second
however many dashboards poll, and database reads run in the thread pool, so a dashboard never
slows the scheduling loop down by more than one snapshot per second.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from html import escape
from pathlib import Path
from string import Template
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Header, Query
from fastapi.responses import FileResponse, HTMLResponse
from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from starlette.concurrency import run_in_threadpool

from gpu_arbiter.control.auth import Authenticator
from gpu_arbiter.control.bills import spend_since
from gpu_arbiter.control.errors import NotFound, Unavailable
from gpu_arbiter.control.jobrows import job_view
from gpu_arbiter.control.loop import ControlLoop
from gpu_arbiter.control.store import AUDIT, JOBS, LEDGER, NODES, SETTINGS, TELEMETRY
from gpu_arbiter.domain import MILLI
from gpu_arbiter.metrics import Segment
from gpu_arbiter.web import jobs, reports, snapshot
from gpu_arbiter.web.views import (
    EVENT_ACTIONS,
    Viewer,
    heatmap_view,
    period_spend,
    queue_view,
    segments_from_ledger,
    teams_view,
    timeline_view,
)

log = logging.getLogger("gpu_arbiter.web")
HERE = Path(__file__).parent
STATIC = {
    "app.css": "text/css",
    "common.js": "text/javascript",
    "dashboard.js": "text/javascript",
    "job.js": "text/javascript",
}
SCRIPTS = "<script src='/ui/static/common.js'></script><script src='/ui/static/{}'></script>"
SNAPSHOT_TTL_S = 1.0
LEDGER_TTL_S = 5.0
T = TypeVar("T")


class _Ttl:
    """Values kept for a few seconds, computed once however many requests ask at the same time."""

    def __init__(self) -> None:
        self._values: dict[Any, tuple[float, Any]] = {}
        self._locks: dict[Any, asyncio.Lock] = {}

    async def get(self, key: Any, ttl_s: float, make: Callable[[], Awaitable[T]]) -> T:
        hit = self._values.get(key)
        if hit is not None and time.monotonic() - hit[0] < ttl_s:
            return hit[1]
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            hit = self._values.get(key)
            if hit is not None and time.monotonic() - hit[0] < ttl_s:
                return hit[1]
            value = await make()
            self._values[key] = (time.monotonic(), value)
            return value


def _template(name: str, **values: str) -> str:
    return Template((HERE / "templates" / name).read_text()).substitute(values)


def _page(title: str, content: str, active: str, scripts: str = "") -> HTMLResponse:
    html = _template(
        "layout.html",
        title=title,
        content=content,
        scripts=scripts,
        nav_dashboard="active" if active == "dashboard" else "",
        nav_reports="active" if active == "reports" else "",
    )
    return HTMLResponse(html)


def dashboard_router(
    loop: ControlLoop, db: Engine, auth: Authenticator, reports_dir: Path | None = None
) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    cache = _Ttl()

    def viewer(authorization: str | None) -> Viewer:
        p = auth.principal(authorization).require_user()
        return Viewer(p.role, p.team)

    async def snap() -> snapshot.Snapshot:
        async def take() -> snapshot.Snapshot:
            got = await loop.run(_copy_on_loop, loop)
            if isinstance(got, Exception):
                raise Unavailable(f"the dashboard could not read the engine: {got}")
            return await run_in_threadpool(snapshot.build, got)

        return await cache.get("snapshot", SNAPSHOT_TTL_S, take)

    # -- pages -----------------------------------------------------------------------------

    @router.get("/", response_class=HTMLResponse)
    def dashboard() -> HTMLResponse:
        content = _template("dashboard.html", login=_template("login.html"))
        return _page("Cluster", content, "dashboard", SCRIPTS.format("dashboard.js"))

    @router.get("/jobs/{job_id}", response_class=HTMLResponse)
    def job_page(job_id: str) -> HTMLResponse:
        # A shell like the dashboard: the job's data comes from /ui/api/jobs/ with a token.
        content = _template("job.html", login=_template("login.html"), job_id=escape(job_id))
        return _page(f"Job {job_id}", content, "dashboard", SCRIPTS.format("job.js"))

    @router.get("/reports", response_class=HTMLResponse)
    def report_index() -> HTMLResponse:
        found = reports.find_reports(reports_dir)
        body = "<h1>Simulation reports</h1>" + reports.index_html(found, reports_dir)
        return _page("Simulation reports", body, "reports")

    @router.get("/reports/{name}/", response_class=HTMLResponse)
    def report_page(name: str) -> HTMLResponse:
        folder = reports.find_reports(reports_dir).get(name)
        if folder is None:
            raise NotFound(f"no report {name!r}")
        body = f"<h1>Simulation report: {name}</h1>" + reports.report_html(name, folder)
        return _page(f"Report {name}", body, "reports")

    @router.get("/reports/{name}/{file:path}")
    def report_file(name: str, file: str) -> FileResponse:
        folder = reports.find_reports(reports_dir).get(name)
        path = None if folder is None else reports.report_file(folder, file)
        if path is None:
            raise NotFound(f"no file {file!r} in report {name!r}")
        return FileResponse(path, media_type=reports.SERVED[path.suffix])

    @router.get("/ui/static/{name}")
    def static(name: str) -> FileResponse:
        if name not in STATIC:
            raise NotFound(f"no static file {name!r}")
        return FileResponse(
            HERE / "static" / name,
            media_type=STATIC[name],
            headers={"Cache-Control": "no-cache"},
        )

    # -- JSON views ------------------------------------------------------------------------

    @router.get("/ui/api/heatmap")
    async def heatmap(authorization: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        who = viewer(authorization)
        return heatmap_view(await snap(), who)

    @router.get("/ui/api/queue")
    async def queue(
        authorization: Annotated[str | None, Header()] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
    ) -> dict[str, Any]:
        who = viewer(authorization)
        s = await snap()
        rows = await cache.get("pending-rows", SNAPSHOT_TTL_S, lambda: run_in_threadpool(_pending))
        return queue_view(s, who, rows, limit)

    @router.get("/ui/api/teams")
    async def teams(authorization: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        who = viewer(authorization)
        s = await snap()
        since = min((t.period_start for t in s.teams), default=s.now)
        spend, prices = await cache.get(
            ("spend", since), LEDGER_TTL_S, lambda: run_in_threadpool(_spend, since)
        )
        return teams_view(
            s, who, spend, prices.get("credit_value", 1.0), prices.get("currency", "USD")
        )

    @router.get("/ui/api/running")
    async def running(authorization: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        who = viewer(authorization)
        s = await snap()
        rows, charged = await cache.get(
            "running-rows", SNAPSHOT_TTL_S, lambda: run_in_threadpool(_running)
        )
        return jobs.running_view(s, who, rows, charged)

    @router.get("/ui/api/jobs/{job_id}")
    async def job(
        job_id: str, authorization: Annotated[str | None, Header()] = None
    ) -> dict[str, Any]:
        who = viewer(authorization)
        s = await snap()
        got = await run_in_threadpool(_job, job_id)
        if got is None or not who.sees(got[0]["team"]):
            raise NotFound(f"no job {job_id!r}")
        return jobs.job_page_view(*got, s)

    @router.get("/ui/api/timeline")
    async def timeline(
        authorization: Annotated[str | None, Header()] = None,
        window: Annotated[int, Query(ge=60, le=30 * 86_400)] = 3600,
    ) -> dict[str, Any]:
        who = viewer(authorization)
        team = None if who.role == "admin" else who.team
        return await cache.get(
            ("timeline", window, team),
            LEDGER_TTL_S,
            lambda: run_in_threadpool(_timeline, window, team),
        )

    # -- database reads (thread pool) ------------------------------------------------------

    def _pending() -> dict[str, dict[str, Any]]:
        q = select(JOBS.c.id, JOBS.c.name, JOBS.c.reason, JOBS.c.preemptions).where(
            JOBS.c.state == "pending"
        )
        with db.connect() as conn:
            return {r["id"]: dict(r) for r in conn.execute(q).mappings()}

    def _spend(since: float) -> tuple[dict, dict[str, Any]]:
        with db.connect() as conn:
            entries = spend_since(conn, since)
            row = conn.execute(select(SETTINGS.c.value).where(SETTINGS.c.key == "prices")).first()
        return period_spend(entries), (row.value if row else {})

    def _running() -> tuple[list[dict[str, Any]], dict[str, float]]:
        q = select(
            JOBS.c.id, JOBS.c.name, JOBS.c.team, JOBS.c.tier, JOBS.c.spec, JOBS.c.allocation,
            JOBS.c.started_at, JOBS.c.seg_gpus, JOBS.c.seg_borrowed, JOBS.c.preempting,
        ).where(JOBS.c.state == "running")  # fmt: skip
        with db.connect() as conn:
            rows = [dict(r) for r in conn.execute(q).mappings()]
            ids = [r["id"] for r in rows]
            entries = conn.execute(select(LEDGER.c.entry).where(LEDGER.c.job_id.in_(ids)))
            return rows, jobs.net_credits(r.entry for r in entries)

    def _job(job_id: str) -> tuple[dict, list, list, list] | None:
        with db.connect() as conn:
            row = conn.execute(select(JOBS).where(JOBS.c.id == job_id)).mappings().first()
            if row is None:
                return None
            telemetry = conn.execute(
                select(TELEMETRY.c.at, TELEMETRY.c.data)
                .where(TELEMETRY.c.job_id == job_id)
                .order_by(TELEMETRY.c.id.desc())
                .limit(jobs.TELEMETRY_LIMIT)
            ).mappings()
            telemetry_rows = [dict(t) for t in telemetry][::-1]
            audit = conn.execute(
                select(AUDIT).where(AUDIT.c.subject == job_id).order_by(AUDIT.c.id)
            ).mappings()
            audit_rows = [dict(a) for a in audit]
            ledger = conn.execute(
                select(LEDGER.c.entry).where(LEDGER.c.job_id == job_id).order_by(LEDGER.c.seq)
            )
            return job_view(row), telemetry_rows, audit_rows, [e.entry for e in ledger]

    def _history_start(conn: Any) -> float | None:
        """When the service's history begins: its first audit row or node, whichever is first
        (everything it did, from the first node or team set up, is audited)."""
        first_audit = conn.execute(select(AUDIT.c.at).order_by(AUDIT.c.id).limit(1)).scalar()
        first_node = conn.execute(select(func.min(NODES.c.registered_at))).scalar()
        known = [t for t in (first_audit, first_node) if t is not None]
        return min(known) if known else None

    def _timeline(window: int, team: str | None) -> dict[str, Any]:
        """The last `window` seconds, or since the service began if that is later. A team
        sees the events of its own jobs only; an admin every event."""
        now = time.time()
        with db.connect() as conn:
            began = _history_start(conn)
            start = now - window if began is None else max(now - window, min(began, now - 1))
            charges = conn.execute(
                select(LEDGER.c.entry).where(LEDGER.c.at >= start, LEDGER.c.kind == "charge")
            )
            segments = segments_from_ledger(r.entry for r in charges)
            running = conn.execute(
                select(JOBS.c.seg_start, JOBS.c.seg_gpus, JOBS.c.spec).where(
                    JOBS.c.state == "running", JOBS.c.seg_start.is_not(None)
                )
            )
            for r in running:
                share = r.spec.get("gpu_milli", MILLI) / MILLI
                segments.append(Segment.whole(r.seg_start, now, (r.seg_gpus or 0) * share))
            gpus = sum(
                r.gpus for r in conn.execute(select(NODES.c.gpus).where(NODES.c.state == "up"))
            )
            q = select(AUDIT).where(AUDIT.c.at >= start, AUDIT.c.action.in_(tuple(EVENT_ACTIONS)))
            if team is not None:
                own = select(JOBS.c.id).where(JOBS.c.team == team)
                q = q.where(AUDIT.c.subject.in_(own))
            events = conn.execute(q.order_by(AUDIT.c.id.desc()).limit(500)).mappings()
            rows = [dict(e) for e in events][::-1]
        return timeline_view(segments, rows, gpus, start, now)

    return router


def _copy_on_loop(tx: Any, loop: ControlLoop) -> snapshot.Copied | Exception:
    """Runs as a loop command. A failure is returned, not raised: the loop treats an unexpected
    error in a command as a broken transaction and rebuilds all its state, which a dashboard
    read must never cause."""
    try:
        return snapshot.copy(loop, tx.now)
    except Exception as e:
        log.exception("dashboard snapshot failed")
        return e
