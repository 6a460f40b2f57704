"""What a caller can do with jobs: submit one (idempotently), list, show, cancel, and read its
log. A job the caller may not see is answered exactly like one that does not exist (`visible`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.engine import Engine

from gpu_arbiter.control.api.deps import JobId, Who, user
from gpu_arbiter.control.auth import Principal
from gpu_arbiter.control.errors import NotFound
from gpu_arbiter.control.jobrows import job_view
from gpu_arbiter.control.schemas import NAME_MAX, NAME_PATTERN, JobSubmit
from gpu_arbiter.control.service import Service
from gpu_arbiter.control.store import JOBS

_KEY_TOO_LONG = "String should have at most 128 characters"
_SUBMIT_OPENAPI: dict[str, Any] = {
    "parameters": [
        {
            "name": "idempotency-key",
            "in": "header",
            "required": False,
            "schema": {"type": "string", "maxLength": 128, "title": "Idempotency-Key"},
        },
    ],
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": JobSubmit.model_json_schema()}},
    },
}


def visible(db: Engine, p: Principal, job_id: str) -> dict[str, Any]:
    """The job's row, if `p` may see it; else NotFound, as for a job that does not exist."""
    with db.connect() as conn:
        row = conn.execute(select(JOBS).where(JOBS.c.id == job_id)).mappings().first()
    if row is None or not p.may_act_for(row["team"]):
        raise NotFound(f"job {job_id} not found")
    return dict(row)


def router(service: Service) -> APIRouter:
    loop, db = service.loop, service.db
    api = APIRouter(tags=["jobs"])

    @api.post("/v1/jobs", status_code=201, response_model=None, openapi_extra=_SUBMIT_OPENAPI)
    async def submit(request: Request) -> Response:
        """Queue a job (body: JobSubmit). The answer comes after the job is committed; sending
        the same `Idempotency-Key` header (or `client_key`) again returns the same job with
        200."""
        # The API's hot path reads its own headers and body instead of declaring them:
        # FastAPI's parameter machinery cost more CPU than the rest of a submission. The checks
        # are the same: the same model, the same 422 naming the field.
        p = await user(request)
        key = request.headers.get("idempotency-key")
        if key is not None and len(key) > 128:
            raise RequestValidationError(
                [{"loc": ("header", "idempotency-key"), "msg": _KEY_TOO_LONG, "type": "too_long"}]
            )
        try:
            req = JobSubmit.model_validate_json(await request.body())
        except ValidationError as e:
            raise RequestValidationError(
                [{**err, "loc": ("body", *err["loc"])} for err in e.errors()]
            ) from None
        body = req.model_dump(mode="json", exclude={"client_key"})
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        row, created = await loop.run(loop.commands.submit, p, req, key, digest)
        return JSONResponse(job_view(row), status_code=201 if created else 200)

    @api.get("/v1/jobs")
    def list_jobs(
        p: Who,
        state: Annotated[
            str | None, Query(pattern="^(pending|running|completed|failed|cancelled|active)$")
        ] = None,
        team: Annotated[str | None, Query(max_length=NAME_MAX, pattern=NAME_PATTERN)] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> list[dict[str, Any]]:
        q = select(JOBS).order_by(JOBS.c.seq.desc()).limit(limit)
        if p.role != "admin":
            if p.role != "team" or (team is not None and team != p.team):
                return []
            team = p.team
        if team is not None:
            q = q.where(JOBS.c.team == team)
        if state == "active":
            q = q.where(JOBS.c.state.in_(("pending", "running")))
        elif state is not None:
            q = q.where(JOBS.c.state == state)
        with db.connect() as conn:
            rows = conn.execute(q).mappings().all()
        return [job_view(r) for r in reversed(rows)]

    @api.get("/v1/jobs/{job_id}")
    def show_job(job_id: JobId, p: Who) -> dict[str, Any]:
        return job_view(visible(db, p, job_id))

    @api.post("/v1/jobs/{job_id}/cancel")
    async def cancel_job(job_id: JobId, p: Who) -> dict[str, Any]:
        return job_view(await loop.run(loop.commands.cancel, p, job_id))

    @api.delete("/v1/jobs/{job_id}")
    async def delete_job(job_id: JobId, p: Who) -> dict[str, Any]:
        return job_view(await loop.run(loop.commands.cancel, p, job_id))

    @api.get("/v1/jobs/{job_id}/log", response_class=PlainTextResponse)
    def job_log(
        job_id: JobId, p: Who, tail: Annotated[int, Query(ge=1, le=1_000_000)] = 65536
    ) -> str:
        visible(db, p, job_id)
        path: Path = service.backend.log_path(job_id)
        if not path.is_file():
            return ""
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - tail))
            return f.read().decode(errors="replace")

    return api
