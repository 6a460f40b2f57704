"""E5 chargeback report: per team, what it used, what it paid and what it is paying now.

Everything is derived from the ledger, plus two inputs the ledger cannot know:

* `burn_rates`: credits per hour of each team's running jobs now (`ChargeModel.burn_rates`);
* `useful_gpu_seconds`: GPU-seconds that produced kept progress (goodput, F4), per team. When a
  team is missing there, the `useful_gpu_seconds` recorded on its charges are summed instead;
  when no charge carries one either, cost per useful GPU-hour is unknown (None).

GPU-hours are the hours the team *held* (every charge, including lost work the cluster later
refunded), by GPU type and tier. Credits spent are charges less refunds. Remaining budget comes
from `Budgets.remaining` at `now` when budgets are given, else it is the team account's balance
(lifetime grants less net spend).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from gpu_arbiter.domain import InvalidInput
from gpu_arbiter.economy.budget import Budgets
from gpu_arbiter.economy.chargeback import RERUN
from gpu_arbiter.economy.ledger import CHARGE, GRANT, REFUND, Ledger, team_account
from gpu_arbiter.economy.prices import PriceTable


@dataclass(frozen=True, slots=True)
class TeamBill:
    """One team's line of the chargeback report. Credits are converted with `credit_value`."""

    team: str
    gpu_hours: Mapping[tuple[str, int], float]
    credits_charged: float
    credits_refunded: float
    rerun_credits: float
    credits_granted: float
    remaining_credits: float
    useful_gpu_hours: float | None
    burn_rate: float
    credit_value: float = 1.0
    currency: str = "USD"

    @property
    def credits_spent(self) -> float:
        return self.credits_charged - self.credits_refunded

    @property
    def gpu_hours_total(self) -> float:
        return math.fsum(self.gpu_hours.values())

    @property
    def credits_per_useful_gpu_hour(self) -> float | None:
        if not self.useful_gpu_hours:
            return None
        return self.credits_spent / self.useful_gpu_hours

    def money(self, credits: float) -> float:
        return credits * self.credit_value

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: plain numbers, None where unknown or unlimited (never inf)."""
        per_useful = self.credits_per_useful_gpu_hour
        remaining = None if math.isinf(self.remaining_credits) else self.remaining_credits
        return {
            "team": self.team,
            "currency": self.currency,
            "gpu_hours": [
                {"gpu_type": gpu_type, "tier": tier, "gpu_hours": hours}
                for (gpu_type, tier), hours in sorted(self.gpu_hours.items())
            ],
            "gpu_hours_total": self.gpu_hours_total,
            "useful_gpu_hours": self.useful_gpu_hours,
            "credits_charged": self.credits_charged,
            "credits_refunded": self.credits_refunded,
            "credits_spent": self.credits_spent,
            "money_spent": self.money(self.credits_spent),
            "rerun_credits": self.rerun_credits,
            "credits_per_useful_gpu_hour": per_useful,
            "money_per_useful_gpu_hour": None if per_useful is None else self.money(per_useful),
            "burn_rate_credits_per_hour": self.burn_rate,
            "burn_rate_money_per_hour": self.money(self.burn_rate),
            "credits_granted": self.credits_granted,
            "remaining_credits": remaining,
            "remaining_money": None if remaining is None else self.money(remaining),
        }


@dataclass(slots=True)
class TeamTotals:
    """What one team's bill adds up from the ledger: credits granted, charged, refunded and
    charged for re-runs, GPU-seconds held by (GPU type, tier), and the useful GPU-seconds its
    charges record (None when none records any). The live service has its database sum them
    (control/bills.py); `team_bills` sums a ledger in memory."""

    granted: float = 0.0
    charged: float = 0.0
    refunded: float = 0.0
    rerun: float = 0.0
    gpu_seconds: dict[tuple[str, int], float] = field(default_factory=dict)
    useful_gpu_seconds: float | None = None

    @property
    def balance(self) -> float:
        """The team account's balance: lifetime grants less net spend."""
        return self.granted - self.charged + self.refunded


def team_bills(
    ledger: Ledger,
    *,
    prices: PriceTable | None = None,
    burn_rates: Mapping[str, float] | None = None,
    useful_gpu_seconds: Mapping[str, float] | None = None,
    budgets: Budgets | None = None,
    now: float | None = None,
) -> list[TeamBill]:
    """One bill per team seen in the ledger or the inputs, sorted by name."""
    if budgets is not None and now is None:
        raise InvalidInput("report: budgets need `now` to know the period")
    acc: dict[str, _Acc] = {}
    for e in ledger.entries():
        a = acc.setdefault(e.team, _Acc())
        if e.kind == GRANT:
            a.granted.append(e.credits)
        elif e.kind == REFUND:
            a.refunded.append(e.credits)
        elif e.kind == CHARGE:
            assert e.gpu_type is not None and e.tier is not None and e.gpu_seconds is not None
            a.charged.append(e.credits)
            if e.reason == RERUN:
                a.rerun.append(e.credits)
            a.gpu_seconds.setdefault((e.gpu_type, int(e.tier)), []).append(e.gpu_seconds)
            if e.useful_gpu_seconds is not None:
                a.useful.append(e.useful_gpu_seconds)

    def remaining(team: str) -> float:
        if budgets is not None and now is not None:
            return budgets.remaining(team, now)
        return ledger.balance(team_account(team))

    return bills_from_totals(
        {team: a.totals() for team, a in acc.items()},
        remaining=remaining,
        prices=prices,
        burn_rates=burn_rates,
        useful_gpu_seconds=useful_gpu_seconds,
        teams=budgets.budgets if budgets else (),
    )


def bills_from_totals(
    totals: Mapping[str, TeamTotals],
    *,
    remaining: Callable[[str], float] | None = None,
    prices: PriceTable | None = None,
    burn_rates: Mapping[str, float] | None = None,
    useful_gpu_seconds: Mapping[str, float] | None = None,
    teams: Iterable[str] = (),
) -> list[TeamBill]:
    """One bill per team of `totals`, the inputs or `teams`, sorted by name. `remaining` gives
    a team's remaining credits (default: its account's balance); `useful_gpu_seconds`, when it
    names a team, replaces what its charges record."""
    prices = prices or PriceTable()
    burn_rates = burn_rates or {}
    useful_in = useful_gpu_seconds or {}
    names = {*totals, *burn_rates, *useful_in, *teams}
    bills = []
    for team in sorted(names):
        t = totals.get(team) or TeamTotals()
        if team in useful_in:
            useful: float | None = useful_in[team] / 3600
        else:
            useful = None if t.useful_gpu_seconds is None else t.useful_gpu_seconds / 3600
        bills.append(
            TeamBill(
                team=team,
                gpu_hours={k: v / 3600 for k, v in t.gpu_seconds.items()},
                credits_charged=t.charged,
                credits_refunded=t.refunded,
                rerun_credits=t.rerun,
                credits_granted=t.granted,
                remaining_credits=t.balance if remaining is None else remaining(team),
                useful_gpu_hours=useful,
                burn_rate=burn_rates.get(team, 0.0),
                credit_value=prices.credit_value,
                currency=prices.currency,
            )
        )
    return bills


def render_bills(bills: list[TeamBill], title: str = "Chargeback by team") -> Table:
    """A Rich table of `team_bills`: credits first, money beside them (E5)."""
    currency = bills[0].currency if bills else "USD"
    table = Table(title=title)
    for name in (
        "team",
        "GPU-hours (type tier)",
        "spent (credits)",
        f"spent ({currency})",
        "re-run (credits)",
        "refunded (credits)",
        "useful GPU-h",
        "credits / useful GPU-h",
        "burn (credits/h)",
        f"burn ({currency}/h)",
        "remaining (credits)",
    ):
        table.add_column(name, justify="left" if name.startswith(("team", "GPU")) else "right")
    for b in bills:
        per_useful = b.credits_per_useful_gpu_hour
        table.add_row(
            b.team,
            "\n".join(f"{t} t{tier}: {h:,.1f}" for (t, tier), h in sorted(b.gpu_hours.items()))
            or "-",
            f"{b.credits_spent:,.1f}",
            f"{b.money(b.credits_spent):,.2f}",
            f"{b.rerun_credits:,.1f}",
            f"{b.credits_refunded:,.1f}",
            "-" if b.useful_gpu_hours is None else f"{b.useful_gpu_hours:,.1f}",
            "-" if per_useful is None else f"{per_useful:,.3f}",
            f"{b.burn_rate:,.2f}",
            f"{b.money(b.burn_rate):,.2f}",
            "unlimited" if math.isinf(b.remaining_credits) else f"{b.remaining_credits:,.1f}",
        )
    return table


@dataclass(slots=True)
class _Acc:
    """Amounts collected per team before summing them exactly with `math.fsum`."""

    granted: list[float] = field(default_factory=list)
    charged: list[float] = field(default_factory=list)
    refunded: list[float] = field(default_factory=list)
    rerun: list[float] = field(default_factory=list)
    useful: list[float] = field(default_factory=list)
    gpu_seconds: dict[tuple[str, int], list[float]] = field(default_factory=dict)

    def totals(self) -> TeamTotals:
        return TeamTotals(
            granted=math.fsum(self.granted),
            charged=math.fsum(self.charged),
            refunded=math.fsum(self.refunded),
            rerun=math.fsum(self.rerun),
            gpu_seconds={k: math.fsum(v) for k, v in self.gpu_seconds.items()},
            useful_gpu_seconds=math.fsum(self.useful) if self.useful else None,
        )
