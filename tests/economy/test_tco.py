from pathlib import Path

import pytest

import gpu_arbiter
from gpu_arbiter.domain import InvalidInput
from gpu_arbiter.economy import TcoConfig, evaluate

EXAMPLE = Path(gpu_arbiter.__file__).parent / "examples" / "tco-h100-1024.yaml"

SMALL = dict(
    gpus=16,
    gpus_per_node=8,
    gpu_unit_price=30_000,
    node_base_price=60_000,
    network_capex_per_gpu=2_500,
    gpu_power_w=500,
    node_overhead_w=1_000,
    average_load=0.5,
    pue=1.5,
    electricity_price_per_kwh=0.10,
    rack_power_kw=12,
    facility_cost_per_rack_year=10_000,
    ops_cost_per_year=50_000,
    utilisation=0.5,
    goodput=0.8,
    cloud_on_demand_per_gpu_hour=4.0,
    cloud_committed_1y_per_gpu_hour=2.2,
    cloud_committed_3y_per_gpu_hour=1.5,
    lead_time_months=3,
)


def test_small_cluster_matches_the_hand_computed_costs():
    result = evaluate(TcoConfig.from_dict(SMALL))
    # 16 GPUs / 8 per node = 2 nodes; a node peaks at (8 × 500 + 1000) W = 5 kW, so a 12 kW
    # rack holds 2 nodes: 1 rack. IT peak = (16 × 500 + 2 × 1000) W = 10 kW.
    assert (result.nodes, result.racks, result.it_peak_kw) == (2, 1, 10.0)
    build = {o.name: o for o in result.options}["build"]
    # compute  (16 × 30,000 + 2 × 60,000) / 3      = 200,000
    # network  16 × 2,500 / 5                       =   8,000
    # power    10 kW × 0.5 × 1.5 × 8760 h × 0.10    =   6,570
    # facility 1 rack × 10,000                      =  10,000
    # ops                                           =  50,000
    # lead     used GPU-h per month = 16 × 8760 × 0.5 / 12 = 5,840; × 4.0 = 23,360 per month;
    #          × 3 months / 3 years                 =  23,360
    assert build.breakdown == pytest.approx(
        {
            "compute capex": 200_000,
            "network capex": 8_000,
            "power": 6_570,
            "facility": 10_000,
            "ops": 50_000,
            "lead time": 23_360,
        }
    )
    assert build.annual_cost == pytest.approx(297_930)
    # paid: 16 × 8760 = 140,160 GPU-h; useful: × 0.5 × 0.8 = 56,064 GPU-h
    assert build.cost_per_gpu_hour == pytest.approx(297_930 / 140_160)
    assert build.cost_per_useful_gpu_hour == pytest.approx(297_930 / 56_064)
    rent = {o.name: o for o in result.options if o.name != "build"}
    # on-demand pays only the 70,080 used hours: 280,320 → 5.00 per useful GPU-h
    assert rent["rent on-demand"].annual_cost == pytest.approx(70_080 * 4.0)
    assert rent["rent on-demand"].cost_per_useful_gpu_hour == pytest.approx(5.0)
    # committed pays every hour: 140,160 × 2.2 = 308,352 (5.50); × 1.5 = 210,240 (3.75)
    assert rent["rent committed 1y"].cost_per_useful_gpu_hour == pytest.approx(5.5)
    assert rent["rent committed 3y"].cost_per_useful_gpu_hour == pytest.approx(3.75)
    assert result.best.name == "rent committed 3y"
    assert result.recommendation.startswith("rent committed 3y: 3.75 USD")
    assert "25% below rent on-demand" in result.recommendation


def test_configured_opportunity_cost_replaces_the_on_demand_estimate():
    cfg = TcoConfig.from_dict(SMALL | {"opportunity_cost_per_month": 1_000})
    build = evaluate(cfg).options[0]
    assert build.breakdown["lead time"] == pytest.approx(3 * 1_000 / 3)


def test_fully_used_capacity_without_lead_time_recommends_building():
    # build: 200,000 + 8,000 + 6,570 + 10,000 = 224,570 a year over 112,128 useful GPU-h = 2.00,
    # against 2.0 / 0.8 = 2.50 for 3-year committed capacity
    change = {"utilisation": 1.0, "lead_time_months": 0, "ops_cost_per_year": 0}
    cfg = TcoConfig.from_dict(SMALL | change | {"cloud_committed_3y_per_gpu_hour": 2.0})
    result = evaluate(cfg)
    assert result.best.name == "build"
    assert result.best.cost_per_useful_gpu_hour == pytest.approx(224_570 / 112_128)


def test_shipped_example_is_valid_and_gives_a_recommendation():
    result = evaluate(TcoConfig.from_yaml(EXAMPLE))
    assert result.config.gpus == 1024 and result.nodes == 128
    data = result.to_dict()
    assert data["recommended"] in {o["name"] for o in data["options"]}
    for option in data["options"]:
        assert 1.0 < option["cost_per_gpu_hour"] < 5.0  # realistic H100 range
        assert option["cost_per_useful_gpu_hour"] > option["cost_per_gpu_hour"] * 0.99


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gpus": 0}, "tco config: gpus: Input should be greater than 0"),
        ({"pue": 0.9}, "tco config: pue: Input should be greater than or equal to 1"),
        ({"utilisation": 1.5}, "tco config: utilisation: Input should be less than or equal to 1"),
        ({"gpu_unit_price": "a lot"}, "tco config: gpu_unit_price: Input should be a valid number"),
        ({"gpu_count": 8}, "tco config: gpu_count: Extra inputs are not permitted"),
        ({"rack_power_kw": 4}, "rack_power_kw (4.0) is below the peak of one node (5.00 kW)"),
    ],
)
def test_bad_config_is_refused_naming_the_field(change, message):
    with pytest.raises(InvalidInput) as err:
        TcoConfig.from_dict(SMALL | change)
    assert message in str(err.value)


def test_missing_required_field_is_named():
    data = dict(SMALL)
    del data["gpus"]
    with pytest.raises(InvalidInput, match="tco config: gpus: Field required"):
        TcoConfig.from_dict(data)
