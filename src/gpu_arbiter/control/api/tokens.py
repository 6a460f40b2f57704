"""Who holds which API token (admin only): create one (its value is shown once), list them
without their values, revoke one."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from fastapi import Path as InPath
from sqlalchemy import select

from gpu_arbiter.control.api.deps import Who
from gpu_arbiter.control.schemas import MAX_ID, TokenCreate
from gpu_arbiter.control.service import Service
from gpu_arbiter.control.store import TOKENS


def router(service: Service) -> APIRouter:
    loop, db = service.loop, service.db
    api = APIRouter(tags=["tokens"])

    @api.post("/v1/tokens", status_code=201)
    async def create_token(req: TokenCreate, p: Who) -> dict[str, Any]:
        """A new token; its value is shown only in this answer (admin)."""
        return await loop.run(loop.commands.create_token, p, req.role, req.team, req.label)

    @api.get("/v1/tokens")
    def tokens(p: Who) -> list[dict[str, Any]]:
        p.require_admin()
        cols = [TOKENS.c.id, TOKENS.c.role, TOKENS.c.team, TOKENS.c.label]
        cols += [TOKENS.c.created_at, TOKENS.c.revoked_at]
        with db.connect() as conn:
            return [dict(r) for r in conn.execute(select(*cols)).mappings()]

    @api.delete("/v1/tokens/{token_id}")
    async def revoke_token(
        token_id: Annotated[int, InPath(ge=1, le=MAX_ID)], p: Who
    ) -> dict[str, Any]:
        return await loop.run(loop.commands.revoke_token, p, token_id)

    return api
