"""The teams: each one's weight, guaranteed quota, budget and the GPUs it uses now; an admin
creates, changes and deletes them, a team token sees only its own."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from sqlalchemy import select
from sqlalchemy.engine import Engine

from gpu_arbiter.control.api.deps import TeamName, Who
from gpu_arbiter.control.schemas import TeamPut
from gpu_arbiter.control.service import Service
from gpu_arbiter.control.store import JOBS, TEAMS


def router(service: Service) -> APIRouter:
    loop, db = service.loop, service.db
    api = APIRouter(tags=["teams"])

    @api.get("/v1/teams")
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

    @api.put("/v1/teams/{name}")
    async def put_team(name: TeamName, req: TeamPut, p: Who) -> dict[str, Any]:
        """Create or change a team: weight, guaranteed quota per GPU type, budget, the unix
        user its jobs run as (admin)."""
        return await loop.run(loop.commands.put_team, p, name, req)

    @api.delete("/v1/teams/{name}")
    async def delete_team(name: TeamName, p: Who) -> dict[str, Any]:
        """Delete a team with no active jobs (admin); its tokens are revoked, its ledger kept."""
        return await loop.run(loop.commands.delete_team, p, name)

    @api.get("/v1/quotas")
    def quotas(p: Who) -> dict[str, dict[str, int]]:
        return {t["name"]: t["quota"] for t in teams(p)}

    return api


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
