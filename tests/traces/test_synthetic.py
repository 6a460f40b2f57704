"""The synthetic workload offers the load it is asked for, on the capacity the cluster serves."""

import pytest

from gpu_arbiter.domain.presets import medium, small
from gpu_arbiter.traces.synthetic import serving_capacity, synthetic_workload


def offered_load(cluster, load: float) -> float:
    """Reference GPU-seconds of work submitted per second, over the cluster's serving capacity."""
    jobs = synthetic_workload(5000, 11, cluster, load=load)
    span = jobs[-1].submit_s - jobs[0].submit_s
    work = sum(j.gpus * j.duration_s for j in jobs)
    return work / span / serving_capacity(cluster)


def test_serving_capacity_weighs_each_type_by_its_speed():
    c = medium()  # 256 H100 at 1.0 and 256 A100 at 0.87
    assert serving_capacity(c) == pytest.approx(256 * 1.0 + 256 * 0.87)
    assert serving_capacity(small()) == small().total_gpus  # one type at speed 1.0


@pytest.mark.parametrize("load", [0.5, 0.9])
@pytest.mark.parametrize("cluster", [small, medium], ids=["small", "medium"])
def test_the_workload_offers_the_requested_share_of_what_the_cluster_serves(cluster, load):
    # Work is in reference seconds: counting an A100 as a whole reference GPU would offer
    # medium 7 % more than asked, and its queue would grow without end at load 0.9.
    assert offered_load(cluster(), load) == pytest.approx(load, rel=0.03)


def test_speed_factors_are_python_floats():
    # A numpy scalar here made every rate and progress of the job numpy arithmetic (slow).
    jobs = synthetic_workload(500, 3, medium())
    speeds = [s for j in jobs for s in j.gpu_types.values()]
    assert speeds and all(type(s) is float for s in speeds)
