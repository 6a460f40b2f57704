"""The capacity index: buckets and totals move with every take and give (DESIGN: fast rules)."""

import pytest

from gpu_arbiter.domain.presets import small
from gpu_arbiter.engine.capacity import CapacityIndex


def test_an_empty_cluster_has_every_node_in_its_full_bucket():
    index = CapacityIndex(small())
    assert len(index.nodes_with("H100", 8)) == 8
    assert index.type_free == {"H100": 64} and index.whole_free == {"H100": 64}
    assert index.rack_free == {("H100", 0): 32, ("H100", 1): 32}


def test_taking_gpus_moves_the_node_between_buckets_and_books_its_power():
    index = CapacityIndex(small())
    before = index.rack_power[0]
    index.take(0, 0b111, 700.0)
    assert 0 in index.nodes_with("H100", 5) and 0 not in index.nodes_with("H100", 8)
    assert index.type_free["H100"] == 61 and index.whole_free["H100"] == 56
    assert index.rack_free[("H100", 0)] == 29
    assert index.rack_power[0] == before + 3 * 700.0
    index.give(0, 0b111, 700.0)
    assert 0 in index.nodes_with("H100", 8) and index.rack_power[0] == before


def test_taking_a_busy_gpu_is_refused_as_double_booking():
    index = CapacityIndex(small())
    index.take(0, 0b1, 700.0)
    with pytest.raises(RuntimeError, match="double booking"):
        index.take(0, 0b11, 700.0)


def test_giving_back_a_free_gpu_is_refused():
    index = CapacityIndex(small())
    with pytest.raises(RuntimeError, match="releasing free"):
        index.give(0, 0b1, 700.0)


def test_a_down_node_offers_nothing_and_comes_back_with_its_busy_gpus_still_busy():
    index = CapacityIndex(small())
    index.take(0, 0b11, 700.0)
    index.set_down(0)
    assert index.free[0] == 0 and index.type_free["H100"] == 56
    index.give(0, 0b1, 700.0)  # a job on the down node is released
    assert index.free[0] == 0
    index.set_up(0, busy_mask=0b10)
    assert index.free_mask[0] == 0b11111101 and 0 in index.nodes_with("H100", 7)


def test_watts_per_gpu_follow_the_power_profile():
    index = CapacityIndex(small())
    assert index.watts_per_gpu("H100", "normal") == pytest.approx(560.0)
    assert index.watts_per_gpu("H100", "high") == 700.0
