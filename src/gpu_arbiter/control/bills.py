"""Each team's bill as the database sums it from the ledger's columns (`GET /v1/bill`,
`arbiter bill`): the same figures `economy.team_bills` adds up entry by entry.

Why: the ledger only grows, and a bill rebuilt from every entry on each request cost a
dashboard refresh time and memory in proportion to all of history. Grouped by team, kind,
reason, GPU type and tier, the database hands back a number of rows bounded by the teams, the
budget periods (a grant's reason names its period) and the GPU types and tiers they ran on,
whatever the ledger's length.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from gpu_arbiter.control.store import LEDGER
from gpu_arbiter.economy import CHARGE, GRANT, REFUND
from gpu_arbiter.economy.chargeback import RERUN
from gpu_arbiter.economy.report import TeamTotals

# One row per team, kind, reason, GPU type and tier: what `read_totals` reads.
_KEYS = (LEDGER.c.team, LEDGER.c.kind, LEDGER.c.reason, LEDGER.c.gpu_type, LEDGER.c.tier)
GROUPS = select(
    *_KEYS,
    func.sum(LEDGER.c.credits),
    func.sum(LEDGER.c.gpu_seconds),
    func.sum(LEDGER.c.useful_gpu_seconds),
    func.count(LEDGER.c.useful_gpu_seconds),
).group_by(*_KEYS)


def read_totals(conn: Connection) -> dict[str, TeamTotals]:
    """Per team, what its bill adds up (`TeamTotals`), summed by the database."""
    totals: dict[str, TeamTotals] = {}
    for team, kind, reason, gpu_type, tier, credits, seconds, useful, has_useful in conn.execute(
        GROUPS
    ):
        t = totals.setdefault(team, TeamTotals())
        if kind == GRANT:
            t.granted += credits
        elif kind == REFUND:
            t.refunded += credits
        elif kind == CHARGE:
            t.charged += credits
            if reason == RERUN:
                t.rerun += credits
            key = (gpu_type, tier)
            t.gpu_seconds[key] = t.gpu_seconds.get(key, 0.0) + seconds
            if has_useful:
                t.useful_gpu_seconds = (t.useful_gpu_seconds or 0.0) + useful
    return totals


def spend_since(conn: Connection, since: float) -> list[dict[str, object]]:
    """Charges and refunds posted since `since` (the budget period's start), summed by the
    database per team, kind and reason: the rows `web.views.period_spend` folds, as few as
    the teams and reasons, where the dashboard used to parse every entry of the period."""
    q = (
        select(
            LEDGER.c.team,
            LEDGER.c.kind,
            LEDGER.c.reason,
            func.sum(LEDGER.c.credits).label("credits"),
            func.coalesce(func.sum(LEDGER.c.gpu_seconds), 0.0).label("gpu_seconds"),
        )
        .where(LEDGER.c.at >= since, LEDGER.c.kind.in_((CHARGE, REFUND)))
        .group_by(LEDGER.c.team, LEDGER.c.kind, LEDGER.c.reason)
    )
    return [dict(r) for r in conn.execute(q).mappings()]
