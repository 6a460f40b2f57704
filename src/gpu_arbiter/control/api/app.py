"""How the REST API is put together: the FastAPI app with its lifespan (the control loop runs
while the app does), error answers, one router per resource and the ASGI layers around them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from fastapi.routing import APIRoute
from fastapi_offline import FastAPIOffline

from gpu_arbiter.control.api import (
    drain,
    economy,
    jobs,
    nodes,
    problems,
    records,
    status,
    teams,
    telemetry,
    tokens,
)
from gpu_arbiter.control.api.deps import known_query_only
from gpu_arbiter.control.api.middleware import FastLane, JsonBodies, LatencyMiddleware
from gpu_arbiter.control.service import Service

# In the order the OpenAPI document lists their paths and /docs its tags.
ROUTERS = (status, jobs, telemetry, nodes, drain, teams, tokens, economy, records)


def create_api(service: Service) -> FastAPI:
    """The REST API; `gpu_arbiter.server` mounts the dashboard beside it."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        service.loop.start()
        try:
            yield
        finally:
            service.loop.stop()
            service.backend.shutdown()
            service.db.dispose()

    # /docs (Swagger UI) and /redoc from assets packaged with fastapi-offline: FastAPI's own
    # pages load them from a CDN and stay blank on a cluster without internet access.
    app = FastAPIOffline(
        static_url="/docs-static",
        title="Arbiter",
        version="0.1.0",
        summary="Who gets which GPUs: jobs, nodes, teams, quotas, prices, ledger, telemetry.",
        lifespan=lifespan,
        responses=problems.RESPONSES,
        dependencies=[Depends(known_query_only)],
    )
    app.state.auth = service.auth
    problems.install(app)
    routers = [part.router(service) for part in ROUTERS]
    for router in routers:
        app.include_router(router)

    openapi = app.openapi
    app.openapi = lambda: app.openapi_schema or problems.errors_are_json(openapi())  # type: ignore[method-assign]
    # The routes are taken from the routers, which keep them: the app keeps each included
    # router as one entry. Exactly one route submits.
    (submit,) = [
        r
        for router in routers
        for r in router.routes
        if isinstance(r, APIRoute) and r.path == "/v1/jobs" and "POST" in r.methods
    ]
    app.add_middleware(FastLane, routes=[submit])
    app.add_middleware(JsonBodies)
    app.add_middleware(LatencyMiddleware, metrics=service.metrics)  # the outermost
    return app
