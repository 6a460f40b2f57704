"""What happened on this server (admin only): the audit log of every change, and every job
since a time with what became of it, as an arbiter-history trace."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse
from sqlalchemy import select

from gpu_arbiter.control.api.deps import Since, Who
from gpu_arbiter.control.history import history_ndjson
from gpu_arbiter.control.service import Service
from gpu_arbiter.control.store import AUDIT


def router(service: Service) -> APIRouter:
    loop, db = service.loop, service.db
    api = APIRouter(tags=["service"])

    @api.get("/v1/audit")
    def audit(
        p: Who,
        since: Since = 0,
        limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
    ) -> list[dict[str, Any]]:
        p.require_admin()
        q = select(AUDIT).where(AUDIT.c.id > since).order_by(AUDIT.c.id).limit(limit)
        with db.connect() as conn:
            return [dict(r) for r in conn.execute(q).mappings()]

    @api.get("/v1/history")
    def history(p: Who, since: Annotated[float | None, Query(ge=0)] = None) -> StreamingResponse:
        """Every job submitted since `since` (epoch seconds) and what became of it, as an
        arbiter-history trace in JSON lines (docs/history-format.md); admin only."""
        p.require_admin()
        lines = history_ndjson(db, since, loop.cfg.policy)
        return StreamingResponse(lines, media_type="application/x-ndjson")

    return api
