"""What GPU time costs and who paid what: the price table (an admin replaces it), the ledger's
entries, and each team's bill summed over the whole ledger (E5)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import select

from gpu_arbiter.control.api.deps import Since, Who
from gpu_arbiter.control.bills import read_totals
from gpu_arbiter.control.schemas import NAME_MAX, NAME_PATTERN
from gpu_arbiter.control.service import Service
from gpu_arbiter.control.store import LEDGER, SETTINGS
from gpu_arbiter.economy import PriceTable
from gpu_arbiter.economy.report import bills_from_totals


def router(service: Service) -> APIRouter:
    loop, db = service.loop, service.db
    api = APIRouter(tags=["economy"])

    @api.get("/v1/prices")
    def prices(p: Who) -> dict[str, Any]:
        with db.connect() as conn:
            row = conn.execute(select(SETTINGS.c.value).where(SETTINGS.c.key == "prices")).first()
        return row.value if row else _price_doc(PriceTable())

    @api.put("/v1/prices")
    async def put_prices(body: dict[str, Any], p: Who) -> dict[str, Any]:
        """Replace the price table (admin); fields as in the price table YAML."""
        return await loop.run(loop.commands.put_prices, p, body)

    @api.get("/v1/ledger")
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

    @api.get("/v1/bill")
    def bill(p: Who) -> list[dict[str, Any]]:
        """Per-team chargeback over the whole ledger (E5): spent, refunded, burn rate; the
        database sums it (control/bills.py)."""
        with db.connect() as conn:
            totals = read_totals(conn)
            price_row = conn.execute(
                select(SETTINGS.c.value).where(SETTINGS.c.key == "prices")
            ).first()
        table = PriceTable.from_dict(price_row.value) if price_row else PriceTable()
        bills = bills_from_totals(totals, prices=table, burn_rates=dict(loop.accounts.burn))
        return [b.to_dict() for b in bills if p.role == "admin" or b.team == p.team]

    return api


def _price_doc(table: PriceTable) -> dict[str, Any]:
    return {
        "on_demand": {str(k): v for k, v in table.on_demand.items()},
        "preemptible": {str(k): v for k, v in table.preemptible.items()},
        "gpu_multipliers": dict(table.gpu_multipliers),
        "default_multiplier": table.default_multiplier,
        "credit_value": table.credit_value,
        "currency": table.currency,
    }
