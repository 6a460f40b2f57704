"""Elastic jobs (S8): start as large as fits, shrink instead of being stopped, grow back."""

from gpu_arbiter.domain import Allocation
from gpu_arbiter.engine import Scheduler
from gpu_arbiter.engine.elastic import shrunk_allocation, start_sizes
from tests.conftest import job
from tests.engine.helpers import cluster, cycle, preempts, resizes, starts


def one_node():
    return cluster({"name": "r0", "nodes": 1})


def test_an_elastic_job_starts_at_its_max_when_there_is_room():
    sched = Scheduler(one_node())
    sched.submit(job("el", gpus=4, min_gpus=2, max_gpus=8), 0.0)
    assert starts(cycle(sched, 0.0))["el"].allocation.gpus == 8


def test_an_elastic_job_starts_smaller_when_only_that_fits():
    sched = Scheduler(one_node())
    sched.submit(job("fixed", gpus=5, duration=1e5), 0.0)
    sched.submit(job("el", gpus=4, min_gpus=2, max_gpus=8), 0.0)
    assert starts(cycle(sched, 0.0))["el"].allocation.gpus == 2


def test_sizes_are_tried_largest_first():
    assert start_sizes(job("el", gpus=4, min_gpus=2, max_gpus=8), elastic=True) == [8, 4, 2]
    assert start_sizes(job("el", gpus=4, min_gpus=2, max_gpus=8), elastic=False) == [4]


def test_a_running_elastic_job_is_shrunk_before_anyone_is_stopped():
    sched = Scheduler(one_node())
    sched.submit(job("el", team="b", gpus=4, min_gpus=2, max_gpus=8, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("core", tier=1, gpus=6), 10.0)
    decisions = cycle(sched, 10.0)
    assert resizes(decisions)["el"].allocation.gpus == 2
    assert preempts(decisions) == {} and "core" in starts(decisions)


def test_an_elastic_job_grows_back_when_capacity_frees():
    sched = Scheduler(one_node())
    sched.submit(job("fixed", gpus=6, duration=100.0), 0.0)
    sched.submit(job("el", gpus=2, max_gpus=8, duration=1e5), 0.0)
    cycle(sched, 0.0)
    assert sched.jobs["el"].gpus_held == 2
    sched.finished("fixed", 100.0)
    assert resizes(cycle(sched, 100.0))["el"].allocation.gpus == 8


def test_work_done_before_a_resize_is_kept():
    sched = Scheduler(one_node())
    sched.submit(job("fixed", gpus=6, duration=100.0), 0.0)
    sched.submit(job("el", gpus=2, max_gpus=8, duration=1000.0), 0.0)
    cycle(sched, 0.0)
    sched.finished("fixed", 100.0)
    cycle(sched, 100.0)
    assert sched.jobs["el"].progress_s == 100.0
    assert sched.jobs["el"].rate == 4.0


def test_shrinking_keeps_whole_tensor_parallel_groups_on_the_first_nodes():
    el = Scheduler(cluster({"name": "r0", "nodes": 2})).submit(
        job("el", gpus=8, min_gpus=4, max_gpus=16, tp_size=4), 0.0
    )
    el.allocation = Allocation("H100", ((0, tuple(range(8))), (1, tuple(range(8)))))
    assert shrunk_allocation(el) == Allocation("H100", ((0, (0, 1, 2, 3)),))
