"""Is the server up (/healthz), what does it measure (/metrics), and who is calling
(/v1/whoami): the `service` tag's routes that any monitor or client asks first."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse

from gpu_arbiter.control.api.deps import Who, caller
from gpu_arbiter.control.service import Service


def router(service: Service) -> APIRouter:
    loop = service.loop
    api = APIRouter(tags=["service"])

    @api.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"ok": True, "nodes": len(loop.state.nodes), "active_jobs": len(loop.state.live)}

    @api.get(
        "/metrics",
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
            p = await caller(request)
            if p.role == "admin":
                teams = "*"
            elif p.role == "team" and teams is None:
                teams = p.team
        body = service.metrics.exposition(teams)
        return Response(body, media_type="text/plain; version=0.0.4")

    @api.get("/v1/whoami")
    def whoami(p: Who) -> dict[str, Any]:
        return {"role": p.role, "team": p.team, "token_id": p.token_id}

    return api
