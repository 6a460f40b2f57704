import pytest

from gpu_arbiter.domain import InvalidInput, Tier
from gpu_arbiter.economy import PriceTable


def test_defaults_match_spec_reference_prices_for_an_h100():
    prices = PriceTable()
    assert prices.price("H100", Tier.CORE, preemptible=False) == 3.5
    assert prices.price("H100", Tier.EXPLORATORY, preemptible=True) == 0.8


def test_higher_priority_costs_more_and_preemptible_costs_less():
    prices = PriceTable()
    for preemptible in (False, True):
        p1, p2, p3 = (prices.price("H100", t, preemptible) for t in Tier)
        assert p1 > p2 > p3
    for tier in Tier:
        assert prices.price("H100", tier, True) < prices.price("H100", tier, False)


def test_newer_gpu_types_cost_more_and_unknown_types_cost_like_the_reference():
    prices = PriceTable()
    order = ["B200", "H200", "H100", "A100", "V100"]
    values = [prices.price(t, Tier.BUSINESS, False) for t in order]
    assert values == sorted(values, reverse=True)
    assert prices.price("MI300X", Tier.BUSINESS, False) == prices.price(
        "H100", Tier.BUSINESS, False
    )


def test_credits_convert_to_money_at_the_configured_value():
    prices = PriceTable.from_dict({"credit_value": 2.5, "currency": "EUR"})
    assert prices.to_money(10) == 25.0
    assert prices.currency == "EUR"


def test_yaml_table_overrides_only_what_it_names(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text("gpu_multipliers: {H100: 1.0, GB200: 2.5}\ndefault_multiplier: 0.5\n")
    prices = PriceTable.from_yaml(path)
    assert prices.price("GB200", Tier.CORE, False) == 2.5 * 3.5
    assert prices.price("A100", Tier.CORE, False) == 0.5 * 3.5  # no longer listed


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"on_demand": {1: 3.5, 2: -1, 3: 1}}, "on_demand.2: Input should be greater than 0"),
        ({"on_demand": {1: 3.5, 2: 3.6, 3: 1}}, "on_demand: a higher priority must not cost less"),
        ({"preemptible": {1: 1, 2: 1}}, "preemptible: needs exactly tiers 1, 2 and 3"),
        ({"preemptible": {1: 9, 2: 1, 3: 0.5}}, "preemptible.1 (9.0) must not exceed on_demand.1"),
        ({"gpu_multipliers": {"H100": 0}}, "gpu_multipliers.H100: Input should be greater than 0"),
        ({"colour": "blue"}, "colour: Extra inputs are not permitted"),
    ],
)
def test_bad_price_field_is_refused_naming_the_field(data, message):
    with pytest.raises(InvalidInput, match="^price table: ") as err:
        PriceTable.from_dict(data)
    assert message in str(err.value)


def test_unreadable_or_malformed_yaml_is_invalid_input(tmp_path):
    with pytest.raises(InvalidInput, match="cannot read"):
        PriceTable.from_yaml(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("on_demand: [1,\n")
    with pytest.raises(InvalidInput, match="malformed YAML"):
        PriceTable.from_yaml(bad)


def test_table_is_immune_to_later_changes_of_the_callers_dict():
    rates = {1: 4.0, 2: 3.0, 3: 2.0}
    prices = PriceTable(on_demand=rates)
    rates[1] = 100.0
    assert prices.price("H100", 1, False) == 4.0
    with pytest.raises(TypeError):
        prices.on_demand[1] = 5.0  # type: ignore[index]
