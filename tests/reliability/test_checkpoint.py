"""F2: lost work is exactly the progress since the last checkpoint; spares restart jobs."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_arbiter.domain import Cluster, InvalidInput, Node, Rack
from gpu_arbiter.reliability import LostWork, RunSegment, SparePool


def test_a_checkpointed_job_loses_only_the_time_since_its_last_checkpoint():
    seg = RunSegment(started_at=100.0, rate=2.0, progress_at_start=50.0, checkpoint_interval_s=30.0)
    # Checkpoints at 130, 160, 190; fails at 200.
    assert seg.lost_work(200.0) == LostWork(
        kept_s=230.0, lost_s=20.0, useful_wall_s=90.0, lost_wall_s=10.0, checkpoint_at=190.0
    )


def test_a_failure_right_at_a_checkpoint_loses_nothing():
    seg = RunSegment(0.0, 1.0, 0.0, 60.0)
    assert seg.lost_work(120.0) == LostWork(120.0, 0.0, 120.0, 0.0, 120.0)


def test_a_failure_before_the_first_checkpoint_falls_back_to_the_resume_point():
    seg = RunSegment(1000.0, 0.5, 400.0, 3600.0)
    assert seg.lost_work(1600.0) == LostWork(400.0, 300.0, 0.0, 600.0, 1000.0)


def test_a_job_that_never_checkpoints_loses_all_its_progress():
    seg = RunSegment(started_at=10.0, rate=1.5, progress_at_start=0.0, checkpoint_interval_s=None)
    assert seg.lost_work(7210.0) == LostWork(0.0, 10800.0, 0.0, 7200.0, 10.0)


def test_a_saved_end_keeps_everything():
    seg = RunSegment(10.0, 1.5, 0.0, None)
    assert seg.lost_work(7210.0, saved=True) == LostWork(10800.0, 0.0, 7200.0, 0.0, 7210.0)


def test_checkpoints_count_from_the_end_of_the_restore():
    seg = RunSegment(0.0, 2.0, 100.0, 60.0, restore_s=30.0)
    assert seg.progress_at(20.0) == 100.0  # still restoring
    assert seg.lost_work(20.0) == LostWork(100.0, 0.0, 0.0, 0.0, 0.0)
    # Progress from 30; checkpoints at 90 and 150; fails at 170.
    assert seg.progress_at(170.0) == 380.0
    assert seg.lost_work(170.0) == LostWork(340.0, 40.0, 120.0, 20.0, 150.0)


def test_times_before_the_start_and_bad_segments_are_refused():
    seg = RunSegment(100.0, 1.0, 0.0, 10.0)
    with pytest.raises(InvalidInput):
        seg.lost_work(99.0)
    with pytest.raises(InvalidInput):
        RunSegment(0.0, -1.0, 0.0, None)
    with pytest.raises(InvalidInput):
        RunSegment(0.0, 1.0, 0.0, 0.0)
    with pytest.raises(InvalidInput):
        RunSegment(0.0, 1.0, 0.0, None, restore_s=math.nan)


segments = st.builds(
    RunSegment,
    started_at=st.floats(0, 1e7),
    rate=st.floats(0, 64),
    progress_at_start=st.floats(0, 1e7),
    checkpoint_interval_s=st.none() | st.floats(1, 1e5),
    restore_s=st.floats(0, 1e3),
)


@given(seg=segments, elapsed=st.floats(0, 1e6), saved=st.booleans())
def test_kept_progress_lies_between_the_resume_point_and_the_progress_reached(seg, elapsed, saved):
    at = seg.started_at + elapsed
    lw = seg.lost_work(at, saved)
    assert seg.progress_at_start <= lw.kept_s <= seg.progress_at(at)
    assert lw.lost_s == seg.rate * lw.lost_wall_s >= 0
    assert seg.started_at <= lw.checkpoint_at <= at
    assert lw.useful_wall_s >= 0 and lw.lost_wall_s >= 0
    assert lw.useful_wall_s + lw.lost_wall_s <= (at - seg.started_at) * (1 + 1e-12)
    if saved:
        assert lw.lost_s == 0


def cluster() -> Cluster:
    nodes = [Node(f"h{i}", "H100", 8, "r0") for i in range(4)]
    nodes += [Node(f"a{i}", "A100", 8, "r1") for i in range(3)]
    nodes += [Node("a-small", "A100", 4, "r1")]
    return Cluster.build("c", nodes, [Rack("r0"), Rack("r1")])


def test_counted_spares_are_the_last_nodes_of_each_gpu_type():
    pool = SparePool.from_cluster(cluster(), per_type=1)
    assert sorted(n.name for n in pool.free) == ["a-small", "h3"]
    pool = SparePool.from_cluster(cluster(), per_type={"H100": 2})
    assert sorted(n.name for n in pool.free) == ["h2", "h3"]


def test_spares_can_be_named():
    pool = SparePool.from_cluster(cluster(), names=["h0", "a1"])
    assert len(pool) == 2 and "h0" in pool and "h1" not in pool


def test_spare_configuration_must_be_one_way_and_possible():
    with pytest.raises(InvalidInput):
        SparePool.from_cluster(cluster(), per_type=1, names=["h0"])
    with pytest.raises(InvalidInput):
        SparePool.from_cluster(cluster())
    with pytest.raises(InvalidInput):
        SparePool.from_cluster(cluster(), per_type={"H100": 5})
    with pytest.raises(InvalidInput):
        SparePool.from_cluster(cluster(), names=["nope"])


def test_take_returns_the_best_fitting_spare_of_the_type_or_none():
    c = cluster()
    pool = SparePool.from_cluster(c, names=["a0", "a-small", "h0"])
    assert pool.take("A100", 4).name == "a-small"
    assert pool.take("A100", 4).name == "a0"
    assert pool.take("A100", 1) is None
    assert pool.take("B200", 8) is None
    assert pool.take("H100", 16) is None
    assert pool.take("H100", 8).name == "h0"
    assert len(pool) == 0


def test_give_back_makes_a_node_a_spare_again_once():
    c = cluster()
    pool = SparePool.from_cluster(c, names=["h0"])
    spare = pool.take("H100", 8)
    pool.give_back(c.node("h1"))  # the repaired node takes the spare's role
    assert pool.take("H100", 8).name == "h1"
    pool.give_back(spare)
    with pytest.raises(InvalidInput):
        pool.give_back(spare)


def test_a_save_at_the_end_is_never_dated_after_it_by_rounding():
    seg = RunSegment(
        started_at=262142.95989848778,
        rate=0.0,
        progress_at_start=0.0,
        checkpoint_interval_s=None,
        restore_s=1.5658316675863944,
    )
    at = seg.started_at + 524290.0
    assert seg.lost_work(at, saved=True).checkpoint_at <= at
