"""How a running job reports progress, and how its team reads it back: a job posts with its
own job token (ARBITER_JOB_TOKEN, derived, never stored) or its team's; reading needs a token
that may see the job."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Security
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select

from gpu_arbiter.control.api.deps import BEARER, JobId, Who, user
from gpu_arbiter.control.api.jobs import visible
from gpu_arbiter.control.schemas import Telemetry
from gpu_arbiter.control.service import Service
from gpu_arbiter.control.store import TELEMETRY


def router(service: Service) -> APIRouter:
    loop, db = service.loop, service.db
    api = APIRouter(tags=["telemetry"])

    @api.post("/v1/jobs/{job_id}/telemetry")
    async def ingest(
        job_id: JobId,
        data: Telemetry,
        request: Request,
        _token: Annotated[Any, Security(BEARER)],
    ) -> dict[str, Any]:
        """Progress from a running job: its job token (ARBITER_JOB_TOKEN) or its team's."""
        token = (request.headers.get("authorization") or "").partition(" ")[2].strip()
        if not (token.startswith("job_") and loop.check_job_token(job_id, token)):
            p = await user(request)
            await run_in_threadpool(visible, db, p, job_id)
        return await loop.run(loop.commands.telemetry, job_id, data)

    @api.get("/v1/jobs/{job_id}/telemetry")
    def telemetry(
        job_id: JobId, p: Who, limit: Annotated[int, Query(ge=1, le=10_000)] = 100
    ) -> list[dict[str, Any]]:
        visible(db, p, job_id)
        q = (
            select(TELEMETRY.c.at, TELEMETRY.c.data)
            .where(TELEMETRY.c.job_id == job_id)
            .order_by(TELEMETRY.c.id.desc())
            .limit(limit)
        )
        with db.connect() as conn:
            rows = conn.execute(q).all()
        return [{"at": r.at, **r.data} for r in reversed(rows)]

    return api
