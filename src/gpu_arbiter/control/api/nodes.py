"""The nodes: what each holds and uses, and the endpoints a node's agent calls (register,
heartbeat) with its agent token; cordoning a node takes an admin."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from sqlalchemy import select
from sqlalchemy.engine import Engine

from gpu_arbiter.control.api.deps import NodeName, NodeWho, Who
from gpu_arbiter.control.schemas import Heartbeat, NodeAction, NodeRegister
from gpu_arbiter.control.service import Service
from gpu_arbiter.control.store import JOBS, NODES


def router(service: Service) -> APIRouter:
    loop, db = service.loop, service.db
    api = APIRouter(tags=["nodes"])

    @api.get("/v1/nodes")
    def nodes(p: NodeWho) -> list[dict[str, Any]]:
        with db.connect() as conn:
            rows = conn.execute(select(NODES).order_by(NODES.c.name)).mappings().all()
        used = _gpus_in_use(db)
        return [{**dict(r), "gpus_used": used.get(r["name"], 0)} for r in rows]

    @api.put("/v1/nodes/{name}")
    async def register_node(name: NodeName, req: NodeRegister, p: NodeWho) -> dict[str, Any]:
        """Register a node's GPUs (agent or admin); registering again is a heartbeat."""
        return await loop.run(loop.commands.register_node, p, name, req)

    @api.post("/v1/nodes/{name}/heartbeat")
    async def heartbeat(name: NodeName, hb: Heartbeat, p: NodeWho) -> dict[str, Any]:
        return await loop.run(loop.commands.heartbeat, p, name, hb)

    @api.post("/v1/nodes/{name}/cordon")
    async def cordon(name: NodeName, p: Who, body: NodeAction | None = None) -> dict[str, Any]:
        reason = body.reason if body else ""
        return await loop.run(loop.commands.node_state, p, name, False, reason)

    @api.post("/v1/nodes/{name}/uncordon")
    async def uncordon(name: NodeName, p: Who) -> dict[str, Any]:
        return await loop.run(loop.commands.node_state, p, name, True, "")

    return api


def _gpus_in_use(db: Engine) -> dict[str, int]:
    with db.connect() as conn:
        rows = conn.execute(select(JOBS.c.allocation).where(JOBS.c.state == "running")).all()
    used: dict[str, int] = {}
    for (alloc,) in rows:
        for node, gpus in (alloc or {}).get("nodes", {}).items():
            used[node] = used.get(node, 0) + len(gpus)
    return used
