import json
import math

import pytest
from rich.console import Console

from gpu_arbiter.domain import InvalidInput, JobSpec, Tier
from gpu_arbiter.economy import (
    Budgets,
    ChargeModel,
    Ledger,
    PriceTable,
    render_bills,
    team_bills,
)

HOUR = 3600.0


@pytest.fixture
def ledger() -> Ledger:
    """vision: a tier-1 H100 run with goodput, then a failed run without checkpoints;
    nlp: a checkpointing tier-3 A100 job that loses half an hour to a failure."""
    ledger = Ledger()
    budgets = Budgets(ledger, {"vision": 1000.0, "nlp": 100.0})
    budgets.open_period(0.0)
    model = ChargeModel()
    vision = JobSpec(id="v1", team="vision", tier=Tier.CORE, gpus=8)
    model.charge_segment(
        ledger,
        vision,
        gpu_type="H100",
        tier=Tier.CORE,
        gpus=8,
        start=0,
        end=HOUR,
        preemptible=False,
        useful_gpu_seconds=6 * HOUR,
    )  # 28 credits, 8 GPU-h held, 6 useful
    model.charge_segment(
        ledger,
        vision,
        gpu_type="H100",
        tier=Tier.CORE,
        gpus=8,
        start=HOUR,
        end=2 * HOUR,
        preemptible=False,
        lost_from=HOUR,
    )  # 28 credits re-run
    nlp = JobSpec(id="n1", team="nlp", gpus=4, checkpoint_interval_s=600)
    model.charge_segment(
        ledger,
        nlp,
        gpu_type="A100",
        tier=Tier.EXPLORATORY,
        gpus=4,
        start=0,
        end=HOUR,
        preemptible=True,
        lost_from=HOUR / 2,
    )  # 0.6 × 0.8 × 4 GPU × 1 h × 0.8 = 1.536 charged, half refunded
    return ledger


def test_bill_shows_gpu_hours_by_type_and_tier_and_net_credits(ledger):
    nlp, vision = team_bills(ledger)  # sorted by team
    assert vision.gpu_hours == {("H100", 1): pytest.approx(16.0)}
    assert vision.credits_spent == pytest.approx(56.0)
    assert vision.rerun_credits == pytest.approx(28.0)
    assert nlp.gpu_hours == {("A100", 3): pytest.approx(4.0)}  # held, including the lost half
    assert nlp.credits_refunded == pytest.approx(0.768)
    assert nlp.credits_spent == pytest.approx(0.768)
    assert vision.remaining_credits == pytest.approx(1000.0 - 56.0)


def test_cost_per_useful_gpu_hour_uses_recorded_goodput_or_the_given_usage(ledger):
    by_team = {b.team: b for b in team_bills(ledger)}
    assert by_team["vision"].useful_gpu_hours == pytest.approx(6.0)
    assert by_team["vision"].credits_per_useful_gpu_hour == pytest.approx(56.0 / 6.0)
    assert by_team["nlp"].useful_gpu_hours is None  # nothing recorded, not "zero useful"
    assert by_team["nlp"].credits_per_useful_gpu_hour is None
    given = {b.team: b for b in team_bills(ledger, useful_gpu_seconds={"nlp": 2 * HOUR})}
    assert given["nlp"].credits_per_useful_gpu_hour == pytest.approx(0.768 / 2.0)


def test_money_and_burn_rate_use_the_credit_value(ledger):
    prices = PriceTable(credit_value=2.0, currency="EUR")
    [bill] = [
        b
        for b in team_bills(ledger, prices=prices, burn_rates={"vision": 28.0})
        if b.team == "vision"
    ]
    data = bill.to_dict()
    assert data["money_spent"] == pytest.approx(112.0)
    assert data["burn_rate_credits_per_hour"] == 28.0
    assert data["burn_rate_money_per_hour"] == 56.0
    assert data["currency"] == "EUR"


def test_remaining_follows_the_budget_period_when_budgets_are_given(ledger):
    budgets = Budgets(ledger, {"vision": 1000.0, "nlp": 100.0, "speech": 5.0})
    by_team = {b.team: b for b in team_bills(ledger, budgets=budgets, now=31 * 86_400.0)}
    assert by_team["vision"].remaining_credits == 0.0  # p1 not opened yet
    assert by_team["speech"].gpu_hours == {}  # budgeted teams appear even without usage
    with pytest.raises(InvalidInput, match="need `now`"):
        team_bills(ledger, budgets=budgets)


def test_bills_are_json_able_and_render_as_a_table(ledger):
    bills = team_bills(ledger, burn_rates={"infra": 1.0})
    text = json.dumps([b.to_dict() for b in bills], allow_nan=False)
    assert {d["team"] for d in json.loads(text)} == {"vision", "nlp", "infra"}
    console = Console(record=True, width=200)
    console.print(render_bills(bills))
    out = console.export_text()
    assert "vision" in out and "H100 t1: 16.0" in out


def test_unlimited_budget_is_none_in_json_not_infinity():
    budgets = Budgets(Ledger(), {})
    [bill] = team_bills(Ledger(), budgets=budgets, now=0.0, burn_rates={"infra": 0.0})
    assert math.isinf(bill.remaining_credits)
    assert bill.to_dict()["remaining_credits"] is None
