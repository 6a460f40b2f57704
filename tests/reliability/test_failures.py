"""F3: the failure model is deterministic, realistic in rate, and cheap at 100k GPUs."""

import pytest

from gpu_arbiter.domain import Cluster, InvalidInput, Node, NodeDown, NodeUp, Rack
from gpu_arbiter.domain.presets import large
from gpu_arbiter.reliability import (
    DEFAULT_KINDS,
    FailureModel,
    FaultKind,
    FaultKindSpec,
    FaultScope,
)
from gpu_arbiter.reliability.failures import YEAR_S

DAY = 86400.0


def grid(nodes: int, gpus: int = 8, gpu_type: str = "H100") -> Cluster:
    racks = [Rack(f"r{i}") for i in range((nodes + 7) // 8)]
    return Cluster.build(
        "test",
        [Node(f"n{i:04d}", gpu_type, gpus, f"r{i // 8}") for i in range(nodes)],
        racks,
    )


def test_same_seed_gives_the_same_schedule_and_another_seed_a_different_one():
    c = grid(125)
    a = FailureModel(seed=7).schedule(c, YEAR_S)
    assert a == FailureModel(seed=7).schedule(c, YEAR_S)
    assert a != FailureModel(seed=8).schedule(c, YEAR_S)


def test_schedule_is_sorted_within_horizon_on_real_nodes_with_repair_in_range():
    c = grid(125)
    faults = FailureModel(seed=1).schedule(c, 2 * YEAR_S)
    assert faults
    assert [f.at for f in faults] == sorted(f.at for f in faults)
    assert all(0 <= f.at < 2 * YEAR_S for f in faults)
    names = {n.name for n in c.nodes}
    specs = {k.kind: k for k in DEFAULT_KINDS}
    for f in faults:
        assert f.node in names
        spec = specs[f.kind]
        assert spec.repair_min_s <= f.repair_s <= spec.repair_max_s
        assert f.fatal == spec.fatal


def test_longer_horizon_extends_a_shorter_schedule_and_iteration_matches():
    c = grid(125)
    model = FailureModel(seed=3)
    short = model.schedule(c, 100 * DAY)
    long = model.schedule(c, 400 * DAY)
    assert long[: len(short)] == short
    assert long[len(short)].at >= 100 * DAY
    later = [f for f in long if f.at >= 50 * DAY]
    it = model.iter_faults(c, start_s=50 * DAY)
    assert [next(it) for _ in later] == later


def test_mean_rate_matches_the_model_over_a_long_horizon():
    c = grid(125)  # 1000 GPUs
    model = FailureModel(seed=11)
    horizon = 50 * YEAR_S
    expected = model.expected_faults(c, horizon)
    assert expected == pytest.approx(50 * (1000 * 0.04 + 125 * 0.05))
    faults = model.schedule(c, horizon)
    assert len(faults) == pytest.approx(expected, rel=0.05)
    fatal = [f for f in faults if f.fatal]
    assert len(fatal) == pytest.approx(model.expected_faults(c, horizon, fatal_only=True), rel=0.05)
    rates = model.annual_rates(c)
    for kind in rates:  # the kinds of this model
        n = sum(1 for f in faults if f.kind is kind)
        assert n == pytest.approx(rates[kind] * 50, rel=0.15)


def test_a_1000_gpu_cluster_sees_a_fault_every_few_days():
    mean_gap_days = 365 / sum(FailureModel(seed=0).annual_rates(grid(125)).values())
    assert 2 < mean_gap_days < 10


def test_gpu_faults_fall_on_nodes_in_proportion_to_their_gpus():
    racks = [Rack("r0"), Rack("r1")]
    nodes = [Node(f"big{i}", "H100", 8, "r0") for i in range(50)]
    nodes += [Node(f"small{i}", "H100", 2, "r1") for i in range(50)]
    c = Cluster.build("mixed", nodes, racks)
    faults = FailureModel(seed=1).schedule(c, 200 * YEAR_S)
    gpu_kinds = {k.kind for k in DEFAULT_KINDS if k.scope is FaultScope.GPU}
    big = sum(1 for f in faults if f.kind in gpu_kinds and f.node.startswith("big"))
    small = sum(1 for f in faults if f.kind in gpu_kinds and f.node.startswith("small"))
    assert big / small == pytest.approx(4.0, rel=0.1)
    host_big = sum(1 for f in faults if f.kind not in gpu_kinds and f.node.startswith("big"))
    host_small = sum(1 for f in faults if f.kind not in gpu_kinds and f.node.startswith("small"))
    assert host_big / host_small == pytest.approx(1.0, rel=0.15)


def test_a_100k_gpu_year_has_the_expected_number_of_faults():
    # How long it takes is measured by `make bench` (bench/dashboard_bench.py).
    c = large()
    model = FailureModel(seed=2)
    faults = model.schedule(c, YEAR_S)
    assert len(faults) == pytest.approx(model.expected_faults(c, YEAR_S), rel=0.05)


def test_a_fault_gives_node_down_and_node_up_events():
    f = FailureModel(seed=0).schedule(grid(125), YEAR_S)[0]
    assert f.node_down() == NodeDown(f.node, f.at, f"fault: {f.kind.value}")
    assert f.node_up() == NodeUp(f.node, f.at + f.repair_s)


def test_zero_rates_give_no_faults():
    assert FailureModel(seed=0, gpu_afr=0.0, node_afr=0.0).schedule(grid(8), YEAR_S) == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"gpu_afr": -0.1},
        {"node_afr": float("nan")},
        {"seed": -1},
        {"kinds": (FaultKindSpec(FaultKind.GPU_FATAL, FaultScope.GPU, 0.5, 1, 2),)},
        {"kinds": DEFAULT_KINDS + DEFAULT_KINDS[:1]},
    ],
)
def test_invalid_models_are_refused(kwargs):
    args = {"seed": 0} | kwargs
    with pytest.raises(InvalidInput):
        FailureModel(**args)


def test_a_kind_with_inverted_repair_range_is_refused():
    with pytest.raises(InvalidInput):
        FaultKindSpec(FaultKind.HOST_CRASH, FaultScope.NODE, 1.0, 60, 30)
