"""The REST API (FastAPI; OpenAPI at /openapi.json, docs at /docs).

Writes go to the control loop (`loop.py`) and are answered after their transaction commits;
reads go straight to the database, which the loop keeps current. Every route but /healthz and
/metrics needs `Authorization: Bearer <token>`; a team token sees only its team's jobs, and a
job it may not see is answered exactly like one that does not exist. Agent tokens reach the
node endpoints only. /metrics shows per-team series only to a token that may see the team
(or to anyone with `public_metrics`).

Errors, each documented in the OpenAPI schema: a bad body, path or query → 422 naming the
field (`{"detail": "body.gpus: ...", "errors": [...]}`), a refused job (e.g. larger than the
cluster) → 422 with the engine's message and `errors: []`, a body that is not even text → 400,
a body not declared JSON → 415, no or bad token → 401, too many bad tokens from one address →
429 with Retry-After, not allowed → 403, unknown → 404, wrong method → 405, state clash → 409,
no nodes yet → 503. Every other error answers `{"detail": "..."}`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request, Response, Security
from fastapi import Path as InPath
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from fastapi.security import HTTPBearer
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel, ValidationError
from sqlalchemy import select
from sqlalchemy.engine import Engine
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from gpu_arbiter.backends.base import Backend
from gpu_arbiter.backends.local import LocalBackend
from gpu_arbiter.control.auth import (
    Authenticator,
    Forbidden,
    Principal,
    TooManyFailures,
    Unauthorized,
)
from gpu_arbiter.control.config import ServerConfig
from gpu_arbiter.control.errors import Conflict, NotFound, Unavailable
from gpu_arbiter.control.history import history_ndjson
from gpu_arbiter.control.jobrows import job_view
from gpu_arbiter.control.loop import ControlLoop
from gpu_arbiter.control.metrics import Metrics
from gpu_arbiter.control.schemas import (
    MAX_ID,
    NAME_MAX,
    NAME_PATTERN,
    NODE_NAME_MAX,
    Drain,
    Heartbeat,
    JobSubmit,
    NodeAction,
    NodeRegister,
    TeamPut,
    Telemetry,
    TokenCreate,
)
from gpu_arbiter.control.store import (
    AUDIT,
    JOBS,
    LEDGER,
    NODES,
    SETTINGS,
    TEAMS,
    TELEMETRY,
    TOKENS,
    open_database,
)
from gpu_arbiter.domain import InvalidInput
from gpu_arbiter.economy import Ledger, PriceTable, team_bills

_STATUS = {
    InvalidInput: 422,
    Unauthorized: 401,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,
    Unavailable: 503,
}


# Documents the bearer token in the OpenAPI schema; the token itself is read by `_caller`.
_BEARER = HTTPBearer(auto_error=False, description="An API token: admin, team or agent.")


async def _caller(request: Request, _token: Annotated[Any, Security(_BEARER)] = None) -> Principal:
    """Whoever holds the request's token, any role. Async, so a known token is resolved on the
    event loop (a sync dependency would cost every request a hop through the thread pool); an
    unknown one is looked up in the database on a worker thread."""
    auth: Authenticator = request.app.state.auth
    authorization = request.headers.get("authorization")
    client = request.client.host if request.client else None
    hit = auth.cached(authorization, client)
    if hit is not None:
        return hit
    return await run_in_threadpool(auth.principal, authorization, client)


async def _who(request: Request, _token: Annotated[Any, Security(_BEARER)] = None) -> Principal:
    """The caller, an admin or a team: agent tokens reach the node endpoints only."""
    return (await _caller(request)).require_user()


Who = Annotated[Principal, Depends(_who)]
NodeWho = Annotated[Principal, Depends(_caller)]
TeamName = Annotated[str, InPath(min_length=1, max_length=NAME_MAX, pattern=NAME_PATTERN)]
NodeName = Annotated[str, InPath(min_length=1, max_length=NODE_NAME_MAX, pattern=NAME_PATTERN)]
JobId = Annotated[str, InPath(min_length=1, max_length=NAME_MAX, pattern=NAME_PATTERN)]
Since = Annotated[int, Query(ge=0, le=MAX_ID)]


class Problem(BaseModel):
    """Every error but a validation error."""

    detail: str


class FieldError(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ValidationProblem(BaseModel):
    """A refused request: `detail` names each bad field in one line, `errors` lists them."""

    detail: str
    errors: list[FieldError]


_QUERY_NAMES: dict[int, set[str]] = {}


async def _known_query_only(request: Request) -> None:
    """Refuse a query parameter the API's route does not take (422 naming it), as the bodies
    refuse unknown fields: a misspelt `?limt=10` must not be quietly ignored."""
    route = request.scope.get("route")
    if route is None or not request.url.path.startswith("/v1/"):
        return
    known = _QUERY_NAMES.get(id(route))
    if known is None:
        known = _QUERY_NAMES[id(route)] = _query_names(route.dependant)
    unknown = [name for name in request.query_params if name not in known]
    if unknown:
        raise RequestValidationError(
            [
                {
                    "loc": ("query", name),
                    "msg": "unknown query parameter",
                    "type": "extra_forbidden",
                }
                for name in unknown
            ]
        )


def _query_names(dependant: Any) -> set[str]:
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


def _problem(description: str, model: type[BaseModel] = Problem) -> dict[str, Any]:
    return {"model": model, "description": description}


_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _problem("The body cannot be read as JSON at all (e.g. not UTF-8)"),
    401: _problem("No token, or an unknown or revoked one"),
    403: _problem("The token may not do this"),
    404: _problem("No such object, or one the token may not see"),
    405: _problem("The path does not take this method"),
    409: _problem("The request clashes with the current state"),
    415: _problem("The body is not JSON"),
    422: _problem("A bad field (named in `detail`) or a refused request", ValidationProblem),
    429: _problem("Too many failed authentications from this address (see Retry-After)"),
    503: _problem("The service cannot do this yet (no GPU nodes)"),
}

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


@dataclass(slots=True)
class Service:
    """Everything one running server holds."""

    db: Engine
    loop: ControlLoop
    auth: Authenticator
    metrics: Metrics
    backend: Any  # a Backend with log_path(job_id) and shutdown(), as every executor has


def build_service(
    db_url: str, config: ServerConfig, min_grace_s: float = 5.0, backend: Backend | None = None
) -> Service:
    """The server's parts; `backend` defaults to local processes under STATE_DIR/jobs."""
    db = open_database(db_url)
    metrics = Metrics()
    auth = Authenticator(db, config.max_auth_failures_per_minute)
    if backend is None:
        backend = LocalBackend(
            config.state_dir / "jobs",
            min_grace_s=min_grace_s,
            jobs_root=config.work_root,
            allow_root=config.allow_root_jobs,
        )
    loop = ControlLoop(db, backend, config, auth, metrics)
    return Service(db, loop, auth, metrics, backend)


def create_api(service: Service) -> FastAPI:
    """The REST API; `gpu_arbiter.server` mounts the dashboard beside it."""
    loop, db, auth = service.loop, service.db, service.auth

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        loop.start()
        try:
            yield
        finally:
            loop.stop()
            service.backend.shutdown()
            db.dispose()

    # /docs (Swagger UI) and /redoc from assets packaged with fastapi-offline: FastAPI's own
    # pages load them from a CDN and stay blank on a cluster without internet access.
    app = FastAPIOffline(
        static_url="/docs-static",
        title="Arbiter",
        version="0.1.0",
        summary="Who gets which GPUs: jobs, nodes, teams, quotas, prices, ledger, telemetry.",
        lifespan=lifespan,
        responses=_RESPONSES,
        dependencies=[Depends(_known_query_only)],
    )
    app.state.auth = auth

    for exc_type, status in _STATUS.items():
        app.add_exception_handler(exc_type, _handler(status))
    app.add_exception_handler(TooManyFailures, _too_many)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)

    # -- service ---------------------------------------------------------------------------

    @app.get("/healthz", tags=["service"])
    def healthz() -> dict[str, Any]:
        return {"ok": True, "nodes": len(loop.state.nodes), "active_jobs": len(loop.state.live)}

    @app.get(
        "/metrics",
        tags=["service"],
        response_class=PlainTextResponse,
        openapi_extra={"security": [{}, {"HTTPBearer": []}]},  # a token is optional here
    )
    async def metrics(request: Request) -> Response:
        """Prometheus exposition. Per-team series (spend, burn rate) need a token: an admin's
        shows every team, a team's its own; without one only cluster-wide series are shown,
        unless the server was started with public metrics."""
        teams: str | None = None
        if service.loop.cfg.public_metrics:
            teams = "*"
        if request.headers.get("authorization"):
            p = await _caller(request)
            if p.role == "admin":
                teams = "*"
            elif p.role == "team" and teams is None:
                teams = p.team
        body = service.metrics.exposition(teams)
        return Response(body, media_type="text/plain; version=0.0.4")

    @app.get("/v1/whoami", tags=["service"])
    def whoami(p: Who) -> dict[str, Any]:
        return {"role": p.role, "team": p.team, "token_id": p.token_id}

    # -- jobs ------------------------------------------------------------------------------

    @app.post(
        "/v1/jobs",
        tags=["jobs"],
        status_code=201,
        response_model=None,
        openapi_extra=_SUBMIT_OPENAPI,
    )
    async def submit(request: Request) -> Response:
        """Queue a job (body: JobSubmit). The answer comes after the job is committed; sending
        the same `Idempotency-Key` header (or `client_key`) again returns the same job with
        200."""
        # The API's hot path reads its own headers and body instead of declaring them:
        # FastAPI's parameter machinery cost more CPU than the rest of a submission. The checks
        # are the same: the same model, the same 422 naming the field.
        p = await _who(request)
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

    @app.get("/v1/jobs", tags=["jobs"])
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

    def visible(p: Principal, job_id: str) -> dict[str, Any]:
        with db.connect() as conn:
            row = conn.execute(select(JOBS).where(JOBS.c.id == job_id)).mappings().first()
        if row is None or not p.may_act_for(row["team"]):
            raise NotFound(f"job {job_id} not found")
        return dict(row)

    @app.get("/v1/jobs/{job_id}", tags=["jobs"])
    def show_job(job_id: JobId, p: Who) -> dict[str, Any]:
        return job_view(visible(p, job_id))

    @app.post("/v1/jobs/{job_id}/cancel", tags=["jobs"])
    async def cancel_job(job_id: JobId, p: Who) -> dict[str, Any]:
        return job_view(await loop.run(loop.commands.cancel, p, job_id))

    @app.delete("/v1/jobs/{job_id}", tags=["jobs"])
    async def delete_job(job_id: JobId, p: Who) -> dict[str, Any]:
        return job_view(await loop.run(loop.commands.cancel, p, job_id))

    @app.get("/v1/jobs/{job_id}/log", tags=["jobs"], response_class=PlainTextResponse)
    def job_log(
        job_id: JobId, p: Who, tail: Annotated[int, Query(ge=1, le=1_000_000)] = 65536
    ) -> str:
        visible(p, job_id)
        path: Path = service.backend.log_path(job_id)
        if not path.is_file():
            return ""
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - tail))
            return f.read().decode(errors="replace")

    @app.post("/v1/jobs/{job_id}/telemetry", tags=["telemetry"])
    async def ingest(
        job_id: JobId,
        data: Telemetry,
        request: Request,
        _token: Annotated[Any, Security(_BEARER)],
    ) -> dict[str, Any]:
        """Progress from a running job: its job token (ARBITER_JOB_TOKEN) or its team's."""
        token = (request.headers.get("authorization") or "").partition(" ")[2].strip()
        if not (token.startswith("job_") and loop.check_job_token(job_id, token)):
            p = await _who(request)
            await run_in_threadpool(visible, p, job_id)
        return await loop.run(loop.commands.telemetry, job_id, data)

    @app.get("/v1/jobs/{job_id}/telemetry", tags=["telemetry"])
    def telemetry(
        job_id: JobId, p: Who, limit: Annotated[int, Query(ge=1, le=10_000)] = 100
    ) -> list[dict[str, Any]]:
        visible(p, job_id)
        q = (
            select(TELEMETRY.c.at, TELEMETRY.c.data)
            .where(TELEMETRY.c.job_id == job_id)
            .order_by(TELEMETRY.c.id.desc())
            .limit(limit)
        )
        with db.connect() as conn:
            rows = conn.execute(q).all()
        return [{"at": r.at, **r.data} for r in reversed(rows)]

    # -- nodes -----------------------------------------------------------------------------

    @app.get("/v1/nodes", tags=["nodes"])
    def nodes(p: NodeWho) -> list[dict[str, Any]]:
        with db.connect() as conn:
            rows = conn.execute(select(NODES).order_by(NODES.c.name)).mappings().all()
        used = _gpus_in_use(db)
        return [{**dict(r), "gpus_used": used.get(r["name"], 0)} for r in rows]

    @app.put("/v1/nodes/{name}", tags=["nodes"])
    async def register_node(name: NodeName, req: NodeRegister, p: NodeWho) -> dict[str, Any]:
        """Register a node's GPUs (agent or admin); registering again is a heartbeat."""
        return await loop.run(loop.commands.register_node, p, name, req)

    @app.post("/v1/nodes/{name}/heartbeat", tags=["nodes"])
    async def heartbeat(name: NodeName, hb: Heartbeat, p: NodeWho) -> dict[str, Any]:
        return await loop.run(loop.commands.heartbeat, p, name, hb)

    @app.post("/v1/nodes/{name}/cordon", tags=["nodes"])
    async def cordon(name: NodeName, p: Who, body: NodeAction | None = None) -> dict[str, Any]:
        reason = body.reason if body else ""
        return await loop.run(loop.commands.node_state, p, name, False, reason)

    @app.post("/v1/nodes/{name}/uncordon", tags=["nodes"])
    async def uncordon(name: NodeName, p: Who) -> dict[str, Any]:
        return await loop.run(loop.commands.node_state, p, name, True, "")

    @app.post("/v1/drain", tags=["server"])
    async def drain(p: Who, body: Drain | None = None) -> dict[str, Any]:
        """Stop the server for good (admin): every running job is stopped with its tier's
        notice and queued again, no job starts, and the server exits once none runs."""
        return await loop.run(loop.commands.drain, p, body.grace_s if body else None)

    # -- teams, quotas, tokens, prices -----------------------------------------------------

    @app.get("/v1/teams", tags=["teams"])
    def teams(p: Who) -> list[dict[str, Any]]:
        with db.connect() as conn:
            rows = conn.execute(select(TEAMS).order_by(TEAMS.c.name)).mappings().all()
        used = _gpus_by_team(db)
        return [
            {
                **dict(r),
                "gpus_used": used.get(r["name"], {}),
                "burn_rate": loop.accounts.burn.get(r["name"], 0.0),
                "credits_spent": loop.accounts.spent.get(r["name"], 0.0),
            }
            for r in rows
            if p.role == "admin" or p.team == r["name"]
        ]

    @app.put("/v1/teams/{name}", tags=["teams"])
    async def put_team(name: TeamName, req: TeamPut, p: Who) -> dict[str, Any]:
        """Create or change a team: weight, guaranteed quota per GPU type, budget, the unix
        user its jobs run as (admin)."""
        return await loop.run(loop.commands.put_team, p, name, req)

    @app.delete("/v1/teams/{name}", tags=["teams"])
    async def delete_team(name: TeamName, p: Who) -> dict[str, Any]:
        """Delete a team with no active jobs (admin); its tokens are revoked, its ledger kept."""
        return await loop.run(loop.commands.delete_team, p, name)

    @app.get("/v1/quotas", tags=["teams"])
    def quotas(p: Who) -> dict[str, dict[str, int]]:
        return {t["name"]: t["quota"] for t in teams(p)}

    @app.post("/v1/tokens", tags=["tokens"], status_code=201)
    async def create_token(req: TokenCreate, p: Who) -> dict[str, Any]:
        """A new token; its value is shown only in this answer (admin)."""
        return await loop.run(loop.commands.create_token, p, req.role, req.team, req.label)

    @app.get("/v1/tokens", tags=["tokens"])
    def tokens(p: Who) -> list[dict[str, Any]]:
        p.require_admin()
        cols = [TOKENS.c.id, TOKENS.c.role, TOKENS.c.team, TOKENS.c.label]
        cols += [TOKENS.c.created_at, TOKENS.c.revoked_at]
        with db.connect() as conn:
            return [dict(r) for r in conn.execute(select(*cols)).mappings()]

    @app.delete("/v1/tokens/{token_id}", tags=["tokens"])
    async def revoke_token(
        token_id: Annotated[int, InPath(ge=1, le=MAX_ID)], p: Who
    ) -> dict[str, Any]:
        return await loop.run(loop.commands.revoke_token, p, token_id)

    @app.get("/v1/prices", tags=["economy"])
    def prices(p: Who) -> dict[str, Any]:
        with db.connect() as conn:
            row = conn.execute(select(SETTINGS.c.value).where(SETTINGS.c.key == "prices")).first()
        return row.value if row else _price_doc(PriceTable())

    @app.put("/v1/prices", tags=["economy"])
    async def put_prices(body: dict[str, Any], p: Who) -> dict[str, Any]:
        """Replace the price table (admin); fields as in the price table YAML."""
        return await loop.run(loop.commands.put_prices, p, body)

    # -- ledger, bills, audit --------------------------------------------------------------

    @app.get("/v1/ledger", tags=["economy"])
    def ledger(
        p: Who,
        team: Annotated[str | None, Query(max_length=NAME_MAX, pattern=NAME_PATTERN)] = None,
        job: Annotated[str | None, Query(max_length=NAME_MAX, pattern=NAME_PATTERN)] = None,
        since: Since = 0,
        limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
    ) -> list[dict[str, Any]]:
        if p.role != "admin":
            team = p.team
        q = select(LEDGER.c.entry).where(LEDGER.c.seq >= since).order_by(LEDGER.c.seq)
        if team is not None:
            q = q.where(LEDGER.c.team == team)
        if job is not None:
            q = q.where(LEDGER.c.job_id == job)
        with db.connect() as conn:
            return [r.entry for r in conn.execute(q.limit(limit))]

    @app.get("/v1/bill", tags=["economy"])
    def bill(p: Who) -> list[dict[str, Any]]:
        """Per-team chargeback from the whole ledger (E5): spent, refunded, burn rate."""
        with db.connect() as conn:
            rows = conn.execute(select(LEDGER.c.entry).order_by(LEDGER.c.seq)).all()
            price_row = conn.execute(
                select(SETTINGS.c.value).where(SETTINGS.c.key == "prices")
            ).first()
        book = Ledger.from_lines(json.dumps(r.entry) for r in rows)
        table = PriceTable.from_dict(price_row.value) if price_row else PriceTable()
        bills = team_bills(book, prices=table, burn_rates=dict(loop.accounts.burn))
        return [b.to_dict() for b in bills if p.role == "admin" or b.team == p.team]

    @app.get("/v1/audit", tags=["service"])
    def audit(
        p: Who,
        since: Since = 0,
        limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
    ) -> list[dict[str, Any]]:
        p.require_admin()
        q = select(AUDIT).where(AUDIT.c.id > since).order_by(AUDIT.c.id).limit(limit)
        with db.connect() as conn:
            return [dict(r) for r in conn.execute(q).mappings()]

    @app.get("/v1/history", tags=["service"])
    def history(p: Who, since: Annotated[float | None, Query(ge=0)] = None) -> StreamingResponse:
        """Every job submitted since `since` (epoch seconds) and what became of it, as an
        arbiter-history trace in JSON lines (docs/history-format.md); admin only."""
        p.require_admin()
        lines = history_ndjson(db, since, loop.cfg.policy)
        return StreamingResponse(lines, media_type="application/x-ndjson")

    openapi = app.openapi
    app.openapi = lambda: app.openapi_schema or _errors_are_json(openapi())  # type: ignore[method-assign]
    hot = [r for r in app.routes if getattr(r, "endpoint", None) is submit]
    app.add_middleware(_FastLane, routes=hot)
    app.add_middleware(_JsonBodies)
    app.add_middleware(_LatencyMiddleware, metrics=service.metrics)  # the outermost
    return app


def _gpus_in_use(db: Engine) -> dict[str, int]:
    with db.connect() as conn:
        rows = conn.execute(select(JOBS.c.allocation).where(JOBS.c.state == "running")).all()
    used: dict[str, int] = {}
    for (alloc,) in rows:
        for node, gpus in (alloc or {}).get("nodes", {}).items():
            used[node] = used.get(node, 0) + len(gpus)
    return used


def _gpus_by_team(db: Engine) -> dict[str, dict[str, int]]:
    with db.connect() as conn:
        rows = conn.execute(
            select(JOBS.c.team, JOBS.c.allocation).where(JOBS.c.state == "running")
        ).all()
    used: dict[str, dict[str, int]] = {}
    for team, alloc in rows:
        if alloc:
            by_type = used.setdefault(team, {})
            n = sum(len(g) for g in alloc["nodes"].values())
            by_type[alloc["gpu_type"]] = by_type.get(alloc["gpu_type"], 0) + n
    return used


def _price_doc(table: PriceTable) -> dict[str, Any]:
    return {
        "on_demand": {str(k): v for k, v in table.on_demand.items()},
        "preemptible": {str(k): v for k, v in table.preemptible.items()},
        "gpu_multipliers": dict(table.gpu_multipliers),
        "default_multiplier": table.default_multiplier,
        "credit_value": table.credit_value,
        "currency": table.currency,
    }


def _handler(status: int) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    async def handle(_request: Request, exc: Exception) -> JSONResponse:
        if status == 422:  # a refusal from beyond the edge has the validation answer's shape
            return JSONResponse({"detail": str(exc), "errors": []}, status_code=status)
        return JSONResponse({"detail": str(exc)}, status_code=status)

    return handle


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's own errors in the one shape; a 405's Allow lists every method of the path,
    not only those of the first route that matched it."""
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        methods = set()
        for route in request.app.router.routes:
            if route.matches(request.scope)[0] != Match.NONE:
                methods |= getattr(route, "methods", None) or set()
        headers["Allow"] = ", ".join(sorted(methods))
    return JSONResponse({"detail": str(exc.detail)}, status_code=exc.status_code, headers=headers)


def _errors_are_json(schema: dict[str, Any]) -> dict[str, Any]:
    """Document every error answer as JSON: FastAPI gives a route's extra responses the
    route's own media type, which for the plain-text routes (/metrics, a job's log) is not
    what their errors are sent as."""
    for ops in schema.get("paths", {}).values():
        for op in ops.values():
            for status, response in op.get("responses", {}).items():
                content = response.get("content", {})
                if not status.startswith("2") and "text/plain" in content:
                    response["content"] = {"application/json": content.pop("text/plain")}
    return schema


async def _too_many(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, TooManyFailures)
    headers = {"Retry-After": str(exc.retry_after_s)}
    return JSONResponse({"detail": str(exc)}, status_code=429, headers=headers)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    lines = []
    for e in errors:
        where = ".".join(str(x) for x in e.get("loc", ()))
        lines.append(f"{where}: {e.get('msg', 'invalid')}")
    clean = [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")} for e in errors
    ]
    return JSONResponse({"detail": "; ".join(lines), "errors": clean}, status_code=422)


class _JsonBodies:
    """Answers 415 to an API request whose body is not declared JSON: every body the API takes
    is a JSON document, and reading `text/plain` or a form as one would hide a client's
    mistake. A request without a body (a cancel, an uncordon) needs no content type."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            headers = dict(scope["headers"])
            ctype = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
            has_body = headers.get(b"content-length", b"0") != b"0" or (
                b"transfer-encoding" in headers
            )
            if (ctype or has_body) and not _is_json(ctype):
                what = ctype.decode(errors="replace") or "none"
                response = JSONResponse(
                    {"detail": f"the body must be application/json, got content type {what}"},
                    status_code=415,
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _is_json(ctype: bytes) -> bool:
    return ctype == b"application/json" or (
        ctype.startswith(b"application/") and ctype.endswith(b"+json")
    )


class _FastLane:
    """Serves the API's hot path (POST /v1/jobs) by calling its endpoint at once: the same
    function and the same exception handlers as through FastAPI, without the routing table and
    the per-request layers in between, which cost more CPU than the submission itself. Every
    other request goes on to FastAPI unchanged."""

    def __init__(self, app: Any, routes: list[Any]) -> None:
        self.app = app
        self.routes = {(m, r.path): r for r in routes for m in r.methods}
        self._handlers: dict[type, Any] | None = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        route = None
        if scope["type"] == "http" and not scope.get("root_path"):
            route = self.routes.get((scope["method"], scope["path"]))
        if route is None:
            await self.app(scope, receive, send)
            return
        scope["route"] = route
        request = Request(scope, receive, send)
        try:
            response = await route.endpoint(request)
        except Exception as exc:
            handler = self._handler(scope, exc)
            if handler is None:
                raise
            response = await handler(request, exc)
        await response(scope, receive, send)

    def _handler(self, scope: dict, exc: Exception) -> Any:
        if self._handlers is None:
            self._handlers = dict(scope["app"].exception_handlers)
        for cls in type(exc).__mro__:
            if cls in self._handlers:
                return self._handlers[cls]
        return None


class _LatencyMiddleware:
    """Times every request by route template (pure ASGI: cheap on the submit hot path)."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        self._series: dict[tuple[str, str], Any] = {}

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            route = scope.get("route")
            key = (scope["method"], getattr(route, "path", "unmatched"))
            series = self._series.get(key)
            if series is None:  # labels() costs more than the observation itself
                series = self._series[key] = self.metrics.api.labels(*key)
            series.observe(time.perf_counter() - t0)
