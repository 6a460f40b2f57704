"""A job's progress within a run segment."""

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from gpu_arbiter.domain import Allocation, Job
from tests.conftest import job


def running(speed: float, stall_s: float) -> Job:
    j = Job(job("x", gpus=2, duration=1e6), tier=3)
    j.allocation = Allocation("H100", ((0, (0, 1)),))
    j.speed = speed
    j.begin_segment(10.0, stall_s)
    return j


@given(
    speed=st.floats(0.1, 3.0),
    stall=st.floats(0.0, 100.0),
    looks=st.lists(st.floats(10.0, 1e5), max_size=20),
    end=st.floats(10.0, 1e5),
)
def test_progress_does_not_depend_on_how_often_the_job_was_advanced(speed, stall, looks, end):
    """Every step that reads a job advances it; a step reading it once more must not change
    any result, not even in the last bit (the simulator's runs stay comparable)."""
    once, often = running(speed, stall), running(speed, stall)
    for t in sorted(t for t in looks if t <= end):
        often.advance(t)
    once.advance(end)
    often.advance(end)
    assert often.progress_s == once.progress_s
    assert often.progress_at(end + 50.0) == once.progress_at(end + 50.0)


def test_no_progress_while_restoring_then_at_the_rate():
    j = running(speed=1.5, stall_s=60.0)
    j.advance(40.0)
    assert j.progress_s == 0.0
    j.advance(170.0)
    assert j.progress_s == 1.5 * 100.0


def test_a_specs_elastic_range_follows_its_sizes_through_replace_and_is_no_part_of_equality():
    spec = job("e", gpus=2)
    assert spec.elastic_range == (2, 2)
    wider = dataclasses.replace(spec, min_gpus=1, max_gpus=4)
    assert wider.elastic_range == (1, 4)
    assert dataclasses.replace(wider, min_gpus=None).elastic_range == (2, 4)
    assert dataclasses.replace(spec) == spec and "elastic_range" not in repr(spec)
