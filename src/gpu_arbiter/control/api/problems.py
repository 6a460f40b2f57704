"""What an error answer looks like, and which exception gets which status.

Every error is JSON: `{"detail": "..."}`, and for a refused request (422) also `errors`, the
bad fields one by one. `RESPONSES` documents each status on every operation of the OpenAPI
schema; `install` makes FastAPI answer them so.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from gpu_arbiter.control.auth import Forbidden, TooManyFailures, Unauthorized
from gpu_arbiter.control.errors import Conflict, NotFound, Unavailable
from gpu_arbiter.domain import InvalidInput

_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")
_STATUS = {
    InvalidInput: 422,
    Unauthorized: 401,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,
    Unavailable: 503,
}


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


def _problem(description: str, model: type[BaseModel] = Problem) -> dict[str, Any]:
    return {"model": model, "description": description}


RESPONSES: dict[int | str, dict[str, Any]] = {
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


def install(app: FastAPI) -> None:
    """Answer the control plane's errors, and FastAPI's own, in the shapes above."""
    for exc_type, status in _STATUS.items():
        app.add_exception_handler(exc_type, _handler(status))
    app.add_exception_handler(TooManyFailures, _too_many)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)


def errors_are_json(schema: dict[str, Any]) -> dict[str, Any]:
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
        headers["Allow"] = ", ".join(_allowed(request))
    return JSONResponse({"detail": str(exc.detail)}, status_code=exc.status_code, headers=headers)


def _allowed(request: Request) -> list[str]:
    """The methods some route of the app takes at the request's path. Each method is tried
    against the routing table: FastAPI keeps an included router as one opaque entry, so its
    routes' methods cannot be read off `app.routes`, but the entry answers whether it matches."""
    return [
        method
        for method in _METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] == Match.FULL
            for route in request.app.router.routes
        )
    ]


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
