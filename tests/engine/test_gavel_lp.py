"""Gavel's max-min fairness LP against cases solved by hand."""

import numpy as np
import pytest

from gpu_arbiter.engine.policies.gavel_lp import max_min_allocation


def test_three_jobs_on_two_types_get_the_hand_solved_allocation():
    """One GPU of each type. Normalised by the equal split (half on each), job 1 (3, 1 steps/s)
    gains most from type A, job 2 (1, 1) nothing, job 3 (2, 1) in between: A goes to job 1, B to
    job 2, and job 3 takes the rest of both. With every job at t: 1.5 a1 = b2 = t,
    a3 = 1 - a1, b3 = 1 - b2, and (4/3) a3 + (2/3) b3 = t give t = 18/23."""
    x = max_min_allocation(np.array([[3.0, 1.0], [1.0, 1.0], [2.0, 1.0]]), [1, 1, 1], [1, 1])
    assert x == pytest.approx(np.array([[12, 0], [0, 18], [11, 5]]) / 23, abs=1e-7)


def test_a_job_on_more_gpus_needs_less_of_the_time_for_the_same_share():
    """Gavel weighs a job by its GPU count: on 2 GPUs, a 1-GPU job and a 2-GPU job of equal
    speed reach the same share with all the time for the first and half for the second."""
    x = max_min_allocation(np.array([[1.0], [2.0]]), [1, 2], [2])
    assert x == pytest.approx(np.array([[1.0], [0.5]]))


def test_a_job_gets_no_time_on_a_type_it_cannot_run_on():
    x = max_min_allocation(np.array([[0.0, 1.0], [1.0, 1.0]]), [1, 1], [1, 1])
    assert x[0, 0] == 0.0


def test_a_job_with_no_type_to_run_on_is_refused():
    with pytest.raises(ValueError, match="non-zero throughput"):
        max_min_allocation(np.array([[0.0, 1.0]]), [1], [1, 0])
