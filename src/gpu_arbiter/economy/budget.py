"""E1 budgets: credits per team per period, granted through the ledger, and what happens when
a team has spent them.

Periods are fixed windows of `period_s` seconds (default 30 days) counted from `epoch_s`;
period `k` covers [epoch + k·period, epoch + (k+1)·period) and is named `p<k>`. A driver calls
`open_period(now)` (cheap and idempotent, e.g. once per scheduling cycle): it posts a grant to
every team that has a budget and has not yet been granted for the period containing `now`.

What a team has left is derived from the ledger, never stored:

* default (`carry_over=False`, use-it-or-lose-it shadow budget): the net of the team account's
  postings dated in the current period (its grant less that period's charges plus refunds).
  Unspent credits do not roll over, so hoarding credits cannot buy a later monopoly.
* `carry_over=True`: the team account's lifetime balance.

A team without a budget (not in the mapping) is not metered: it can always spend.

An exhausted team (nothing left) keeps running work, but new admissions are capped at
`exhausted_tier` (default tier 3: preemptible, exploratory only). The engine asks
`effective_tier(team, requested_tier, now)` at admission; it is a lookup, not a scan, because
the ledger's entries are folded once into net credits per team and period as the ledger grows.
A ledger that holds only the tail of a longer book (`Ledger.resume`) comes with the sums of
what it does not hold (`seed`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpu_arbiter.domain import InvalidInput, Team, Tier
from gpu_arbiter.economy.ledger import GRANT, Entry, Ledger, team_account

DEFAULT_PERIOD_S = 30 * 86_400.0


@dataclass(frozen=True, slots=True)
class BudgetPolicy:
    period_s: float = DEFAULT_PERIOD_S
    epoch_s: float = 0.0
    exhausted_tier: Tier = Tier.EXPLORATORY
    carry_over: bool = False

    def __post_init__(self) -> None:
        if not (self.period_s > 0 and math.isfinite(self.period_s)):
            raise InvalidInput(f"budget: period_s must be > 0, got {self.period_s}")
        if not math.isfinite(self.epoch_s):
            raise InvalidInput(f"budget: epoch_s must be finite, got {self.epoch_s}")
        try:
            Tier(self.exhausted_tier)
        except ValueError:
            raise InvalidInput(
                f"budget: exhausted_tier must be 1, 2 or 3, got {self.exhausted_tier!r}"
            ) from None


class Budgets:
    """Per-team budgets over one ledger. Only `open_period` writes (grants) to the ledger."""

    def __init__(
        self,
        ledger: Ledger,
        budgets: Mapping[str, float],
        policy: BudgetPolicy | None = None,
    ) -> None:
        self.ledger = ledger
        self.budgets: dict[str, float] = {}
        self.set_budgets(budgets)
        self.policy = policy or BudgetPolicy()
        # Per team: net credits per period index and the periods it was granted, folded from
        # the ledger's entries before seq `_folded`. Derived from the ledger; extended, never
        # rewritten.
        self._folded = 0
        self._net: dict[str, dict[int, float]] = {}
        self._granted: dict[str, set[str]] = {}

    def set_budgets(self, budgets: Mapping[str, float]) -> None:
        """Each team's credits per period from now on; teams not in `budgets` are not metered."""
        for team, credits in budgets.items():
            if not (credits >= 0 and math.isfinite(credits)):
                raise InvalidInput(f"budget for team {team}: must be >= 0 credits, got {credits}")
        self.budgets = dict(budgets)

    def seed(self, net: Mapping[str, Mapping[int, float]], granted: Mapping[str, set[str]]) -> None:
        """Start from the sums of the entries the ledger does not hold (it was `resume`d and
        has posted nothing since): net credits per team and period index, and the periods each
        team was granted. Only the periods a caller will ask about are needed."""
        if len(self.ledger.entries()) or self._folded:
            raise InvalidInput("budgets: seed a resumed ledger before anything is posted")
        self._net = {team: dict(by_index) for team, by_index in net.items()}
        self._granted = {team: set(names) for team, names in granted.items()}
        self._folded = len(self.ledger)

    @classmethod
    def for_teams(
        cls, ledger: Ledger, teams: Iterable[Team], policy: BudgetPolicy | None = None
    ) -> Budgets:
        """Budgets from `Team.budget_per_period`; teams with None are not metered."""
        return cls(
            ledger,
            {t.name: t.budget_per_period for t in teams if t.budget_per_period is not None},
            policy,
        )

    # -- periods -------------------------------------------------------------------------------

    def period_index(self, now: float) -> int:
        return math.floor((now - self.policy.epoch_s) / self.policy.period_s)

    def period_start(self, index: int) -> float:
        return self.policy.epoch_s + index * self.policy.period_s

    @staticmethod
    def period_name(index: int) -> str:
        return f"p{index}"

    def open_period(self, now: float) -> list[Entry]:
        """Grant each budgeted team its credits for the period containing `now`, once."""
        index = self.period_index(now)
        name = self.period_name(index)
        posted = []
        self.fold()
        for team, credits in self.budgets.items():
            if name not in self._granted.get(team, ()):
                posted.append(self.ledger.grant(team, credits, name, self.period_start(index)))
        return posted

    # -- queries -------------------------------------------------------------------------------

    def remaining(self, team: str, now: float) -> float:
        """Credits `team` may still spend at `now`; `math.inf` for a team without a budget."""
        if team not in self.budgets:
            return math.inf
        if self.policy.carry_over:
            return self.ledger.balance(team_account(team))
        self.fold()
        return self._net.get(team, {}).get(self.period_index(now), 0.0)

    def can_spend(self, team: str, now: float) -> bool:
        return self.remaining(team, now) > 0

    def effective_tier(self, team: str, requested_tier: Tier | int, now: float) -> Tier:
        """The tier to admit a job at: as asked, or no better than `exhausted_tier` once the
        team's budget is spent (a larger tier number is a lower priority)."""
        tier = Tier(requested_tier)
        if self.can_spend(team, now):
            return tier
        return Tier(max(tier, self.policy.exhausted_tier))

    def grown(self, old: Entry, new: Entry) -> None:
        """Count a charge that grew in place (`Ledger.extend`, within one period): when its
        team's fold had already read it, the team's net for that period drops by what it
        added; otherwise the fold reads the grown charge whole."""
        if old.seq >= self._folded:
            return
        index = self.period_index(old.at)
        assert index == self.period_index(new.at), "a charge grows within its period only"
        net = self._net.setdefault(old.team, {})
        net[index] = net.get(index, 0.0) - (new.credits - old.credits)

    def fold(self) -> None:
        """Fold the entries posted since the last fold (each touches one team's account); a
        ledger about to `forget` its entries is folded first."""
        for e in self.ledger.entries(since=self._folded):
            account = team_account(e.team)
            net = self._net.setdefault(e.team, {})
            index = self.period_index(e.at)
            net[index] = net.get(index, 0.0) + sum(
                p.amount for p in e.postings if p.account == account
            )
            if e.kind == GRANT and e.period is not None:
                self._granted.setdefault(e.team, set()).add(e.period)
        self._folded = len(self.ledger)
