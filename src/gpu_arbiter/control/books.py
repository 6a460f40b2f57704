"""What the ledger in the database adds up to, summed by the database at start-up: each
account's balance, each team's spend, each team's net credits and grants in the current budget
period, the GPU-hours lost to failures, and the charges of the run segments still open.

Why: the ledger only grows (one charge per run segment, its refunds, a grant per team and
period), and a restart that rebuilt it entry by entry in Python took time and memory in
proportion to all of history. From these sums the loop carries on with a ledger that holds only
what it posts from then on (`Ledger.resume`), and reads a number of rows bounded by the running
jobs, the teams and the periods, not by the ledger's length.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, func, select
from sqlalchemy.engine import Connection

from gpu_arbiter.control.store import JOBS, LEDGER
from gpu_arbiter.economy import CHARGE, GRANT, REFUND, RUN, Entry
from gpu_arbiter.economy.ledger import REVENUE, grants_account, team_account


@dataclass(slots=True)
class Books:
    """The sums a resumed ledger and the loop's spend start from (see the module docstring)."""

    next_seq: int
    opening: dict[str, float]
    spent: dict[str, float]
    period_net: dict[str, dict[int, float]]
    granted: dict[str, set[str]]
    lost_gpu_seconds: float
    open_charges: list[Entry]


def read_books(conn: Connection, period: int, start: float, end: float) -> Books:
    """The ledger's sums; `period` is the index of the budget period [start, end) now in."""
    top = conn.execute(select(func.max(LEDGER.c.seq))).scalar()
    books = Books(-1 if top is None else top, {}, {}, {}, {}, 0.0, [])
    books.next_seq += 1
    opening, spent = books.opening, books.spent

    def add(account: str, amount: float) -> None:
        opening[account] = opening.get(account, 0.0) + amount

    total = func.sum(LEDGER.c.credits)
    by_kind_team = select(LEDGER.c.kind, LEDGER.c.team, total).group_by(
        LEDGER.c.kind, LEDGER.c.team
    )
    for kind, team, credits in conn.execute(by_kind_team):
        if kind == GRANT:
            add(team_account(team), credits)
        elif kind == CHARGE:
            add(team_account(team), -credits)
            add(REVENUE, credits)
            spent[team] = spent.get(team, 0.0) + credits
        elif kind == REFUND:
            add(team_account(team), credits)
            add(REVENUE, -credits)
            spent[team] = spent.get(team, 0.0) - credits
    name = LEDGER.c.entry["period"].as_string()
    for period_name, credits in conn.execute(
        select(name, total).where(LEDGER.c.kind == GRANT).group_by(name)
    ):
        add(grants_account(period_name), -credits)

    now = and_(LEDGER.c.at >= start, LEDGER.c.at < end)
    for kind, team, credits in conn.execute(by_kind_team.where(now)):
        net = books.period_net.setdefault(team, {})
        net[period] = net.get(period, 0.0) + (-credits if kind == CHARGE else credits)
    for team, period_name in conn.execute(
        select(LEDGER.c.team, name).where(now, LEDGER.c.kind == GRANT).distinct()
    ):
        books.granted.setdefault(team, set()).add(period_name)

    books.lost_gpu_seconds = _lost_gpu_seconds(conn)
    books.open_charges = _open_charges(conn)
    return books


def _lost_gpu_seconds(conn: Connection) -> float:
    """GPU-seconds lost to failures, as each entry's row records them
    (`accounting.lost_gpu_seconds`)."""
    return conn.execute(select(func.sum(LEDGER.c.lost_gpu_seconds))).scalar() or 0.0


def _open_charges(conn: Connection) -> list[Entry]:
    """The "run" charges of each running job's open segment: what it was charged as it ran,
    which its end may refund and its next accrual grows."""
    rows = conn.execute(
        select(LEDGER.c.entry, JOBS.c.seg_start)
        .join(JOBS, JOBS.c.id == LEDGER.c.job_id)
        .where(
            JOBS.c.state == "running",
            JOBS.c.seg_start.is_not(None),
            LEDGER.c.kind == CHARGE,
            LEDGER.c.at >= JOBS.c.seg_start,
        )
        .order_by(LEDGER.c.seq)
    )
    out = []
    for row in rows:
        e = Entry.from_json(row.entry, f"ledger entry {row.entry.get('seq')}")
        if e.reason == RUN and e.start is not None and e.start >= row.seg_start:
            out.append(e)
    return out
