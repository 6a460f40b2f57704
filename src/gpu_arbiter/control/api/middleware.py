"""What happens to an API request before FastAPI routes it: a body not declared JSON is
answered 415 (`JsonBodies`), the submit hot path skips the routing table (`FastLane`), and
every request is timed by its route (`LatencyMiddleware`). Pure ASGI, each cheap enough for the
submit path."""

from __future__ import annotations

import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from gpu_arbiter.control.metrics import Metrics


class JsonBodies:
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


class FastLane:
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


class LatencyMiddleware:
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
