"""Who is calling, and the parameters every router shares.

A request's bearer token is resolved to a `Principal` once, by `caller`; `Who` (an admin or a
team) guards every route but the node endpoints, which take `NodeWho` (agents too). Path and
query parameters are declared here once so that every route refuses the same bad name the same
way, and `known_query_only` refuses a query parameter no route takes.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Query, Request, Security
from fastapi import Path as InPath
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPBearer

from gpu_arbiter.control.auth import Authenticator, Principal
from gpu_arbiter.control.schemas import MAX_ID, NAME_MAX, NAME_PATTERN, NODE_NAME_MAX

# Documents the bearer token in the OpenAPI schema; the token itself is read by `caller`.
BEARER = HTTPBearer(auto_error=False, description="An API token: admin, team or agent.")


async def caller(request: Request, _token: Annotated[Any, Security(BEARER)] = None) -> Principal:
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


async def user(request: Request, _token: Annotated[Any, Security(BEARER)] = None) -> Principal:
    """The caller, an admin or a team: agent tokens reach the node endpoints only."""
    return (await caller(request)).require_user()


Who = Annotated[Principal, Depends(user)]
NodeWho = Annotated[Principal, Depends(caller)]
TeamName = Annotated[str, InPath(min_length=1, max_length=NAME_MAX, pattern=NAME_PATTERN)]
NodeName = Annotated[str, InPath(min_length=1, max_length=NODE_NAME_MAX, pattern=NAME_PATTERN)]
JobId = Annotated[str, InPath(min_length=1, max_length=NAME_MAX, pattern=NAME_PATTERN)]
Since = Annotated[int, Query(ge=0, le=MAX_ID)]

_QUERY_NAMES: dict[int, set[str]] = {}


async def known_query_only(request: Request) -> None:
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
