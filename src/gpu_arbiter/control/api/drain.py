"""How the server stops for good (the `server` tag): a drain stops every running job with its
tier's notice, queues it again, starts none, and ends the server once none runs."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from gpu_arbiter.control.api.deps import Who
from gpu_arbiter.control.schemas import Drain
from gpu_arbiter.control.service import Service


def router(service: Service) -> APIRouter:
    loop = service.loop
    api = APIRouter(tags=["server"])

    @api.post("/v1/drain")
    async def drain(p: Who, body: Drain | None = None) -> dict[str, Any]:
        """Stop the server for good (admin): every running job is stopped with its tier's
        notice and queued again, no job starts, and the server exits once none runs."""
        return await loop.run(loop.commands.drain, p, body.grace_s if body else None)

    return api
