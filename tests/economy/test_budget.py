import math

import pytest

from gpu_arbiter.domain import InvalidInput, JobSpec, Team, Tier
from gpu_arbiter.economy import BudgetPolicy, Budgets, ChargeModel, Ledger

DAY = 86_400.0


def _spend(ledger: Ledger, team: str, credits: float, at: float) -> None:
    ledger.charge(f"job@{at}", team, credits, "H100", 2, at - 1, at, 1, "run", at)


def test_opening_a_period_grants_each_budgeted_team_once():
    ledger = Ledger()
    budgets = Budgets(ledger, {"vision": 100.0, "nlp": 50.0})
    first = budgets.open_period(0.0)
    assert {(e.team, e.credits, e.period) for e in first} == {
        ("vision", 100.0, "p0"),
        ("nlp", 50.0, "p0"),
    }
    assert budgets.open_period(29 * DAY) == []  # same 30-day period: nothing more
    second = budgets.open_period(30 * DAY)
    assert {e.period for e in second} == {"p1"} and all(e.at == 30 * DAY for e in second)


def test_remaining_is_the_periods_grant_less_its_spend_and_does_not_roll_over():
    ledger = Ledger()
    budgets = Budgets(ledger, {"vision": 100.0})
    budgets.open_period(0.0)
    _spend(ledger, "vision", 30.0, at=DAY)
    assert budgets.remaining("vision", DAY) == 70.0
    budgets.open_period(31 * DAY)
    assert budgets.remaining("vision", 31 * DAY) == 100.0  # the 70 left over expired


def test_carry_over_keeps_unspent_credits():
    ledger = Ledger()
    budgets = Budgets(ledger, {"vision": 100.0}, BudgetPolicy(carry_over=True))
    budgets.open_period(0.0)
    _spend(ledger, "vision", 30.0, at=DAY)
    budgets.open_period(31 * DAY)
    assert budgets.remaining("vision", 31 * DAY) == 170.0


def test_exhausted_team_is_admitted_only_at_tier_three():
    ledger = Ledger()
    budgets = Budgets(ledger, {"vision": 10.0})
    budgets.open_period(0.0)
    assert budgets.effective_tier("vision", Tier.CORE, DAY) == Tier.CORE
    model = ChargeModel()
    spec = JobSpec(id="big", team="vision", tier=Tier.CORE, gpus=8)
    model.charge_segment(
        ledger,
        spec,
        gpu_type="H100",
        tier=Tier.CORE,
        gpus=8,
        start=0,
        end=3600,
        preemptible=False,
    )  # 28 credits: more than the budget
    assert budgets.remaining("vision", DAY) == pytest.approx(-18.0)
    assert not budgets.can_spend("vision", DAY)
    for tier in Tier:
        assert budgets.effective_tier("vision", tier, DAY) == Tier.EXPLORATORY
    budgets.open_period(30 * DAY)
    assert budgets.effective_tier("vision", Tier.CORE, 30 * DAY) == Tier.CORE  # new period


def test_exhausted_tier_is_configurable_and_never_raises_priority():
    ledger = Ledger()
    budgets = Budgets(ledger, {"vision": 0.0}, BudgetPolicy(exhausted_tier=Tier.BUSINESS))
    budgets.open_period(0.0)
    assert budgets.effective_tier("vision", Tier.CORE, 1.0) == Tier.BUSINESS
    assert budgets.effective_tier("vision", Tier.EXPLORATORY, 1.0) == Tier.EXPLORATORY


def test_team_without_a_budget_is_not_metered():
    budgets = Budgets.for_teams(Ledger(), [Team("vision", budget_per_period=5.0), Team("infra")])
    assert budgets.remaining("infra", 0.0) == math.inf
    assert budgets.effective_tier("infra", Tier.CORE, 0.0) == Tier.CORE
    assert budgets.effective_tier("vision", Tier.CORE, 0.0) == Tier.EXPLORATORY  # not yet granted


def test_budgets_over_a_loaded_ledger_see_its_grants(tmp_path):
    ledger = Ledger()
    Budgets(ledger, {"vision": 100.0}, BudgetPolicy(period_s=7 * DAY)).open_period(0.0)
    ledger.to_jsonl(tmp_path / "l.jsonl")
    reloaded = Budgets(
        Ledger.from_jsonl(tmp_path / "l.jsonl"), {"vision": 100.0}, BudgetPolicy(period_s=7 * DAY)
    )
    assert reloaded.open_period(DAY) == []
    assert reloaded.remaining("vision", DAY) == 100.0


def test_bad_budget_settings_are_refused():
    with pytest.raises(InvalidInput, match="period_s"):
        BudgetPolicy(period_s=0)
    with pytest.raises(InvalidInput, match="exhausted_tier"):
        BudgetPolicy(exhausted_tier=5)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="team vision"):
        Budgets(Ledger(), {"vision": -1.0})
