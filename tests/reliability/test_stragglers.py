"""Stragglers: a node whose ranks stay slower than the rest of the gang for a window."""

import pytest

from gpu_arbiter.domain import InvalidInput
from gpu_arbiter.reliability.stragglers import GangWatch, StragglerConfig, detect


def feed(watch: GangWatch, at: float, times: dict[str, float], ranks: int = 4):
    """One report of every rank: `ranks` ranks per node, each at its node's step time."""
    found = []
    for i, (node, t) in enumerate(sorted(times.items())):
        for r in range(ranks):
            hit = watch.observe(at, i * ranks + r, node, t)
            if hit is not None:
                found.append(hit)
    return found


def test_a_node_slower_than_the_rest_for_the_window_is_a_straggler():
    watch = GangWatch("j", StragglerConfig(factor=1.5, window_s=300))
    times = {"a": 1.0, "b": 1.02, "c": 0.98, "d": 1.8}
    found = []
    for at in range(0, 601, 60):
        found += feed(watch, float(at), times)
    assert [(s.node, s.since, s.at) for s in found] == [("d", 0.0, 300.0)]
    assert found[0].ratio == pytest.approx(1.8)
    assert found[0].reason.startswith("straggler: its ranks took 1.8x the gang's median")


def test_a_node_that_recovers_within_the_window_is_not_one():
    watch = GangWatch("j", StragglerConfig(window_s=300))
    found = []
    for at in range(0, 1201, 60):
        slow = 2.0 if (at // 240) % 2 == 0 else 1.0  # slow for 4 minutes at a time
        found += feed(watch, float(at), {"a": 1.0, "b": slow})
    assert found == []


def test_in_a_two_node_gang_the_slow_node_is_compared_with_the_other_one():
    # Against the median of all ranks (1.5) a node at 2.0 would be only 1.33x slower.
    watch = GangWatch("j", StragglerConfig(factor=1.5, window_s=0))
    assert [s.node for s in feed(watch, 0.0, {"a": 1.0, "b": 2.0})] == ["b"]


def test_a_slightly_slower_node_or_a_single_node_job_is_left_alone():
    watch = GangWatch("j", StragglerConfig(factor=1.5, window_s=0))
    assert feed(watch, 0.0, {"a": 1.0, "b": 1.4}) == []
    alone = GangWatch("k", StragglerConfig(window_s=0))
    assert feed(alone, 0.0, {"a": 5.0}) == []


@pytest.mark.parametrize("bad", [{"factor": 1.0}, {"factor": float("inf")}, {"window_s": -1}])
def test_nonsense_settings_are_refused(bad):
    with pytest.raises(InvalidInput):
        StragglerConfig(**bad)


def test_the_simulators_synthetic_gang_is_caught_after_the_window_and_only_when_slow():
    cfg = StragglerConfig(factor=1.5, window_s=300)
    found = detect((8, 8, 8), slow=2, slowdown=2.0, interval_s=60, config=cfg, horizon_s=3600)
    assert found is not None and (found.node, found.since, found.at) == ("2", 0, 300)
    assert detect((8, 8), 1, 1.1, 60, cfg, 3600) is None  # 10 % slower is within the factor
