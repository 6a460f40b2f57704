"""The backend learns a job's walltime estimate with its placement (Slurm's `--time` is made
from it)."""

from __future__ import annotations

import pytest

from gpu_arbiter.control.store import open_database
from tests.control.direct import Executor, new_loop, setup, submit, tick


@pytest.fixture
def db(tmp_path):
    engine = open_database(str(tmp_path / "a.db"))
    yield engine
    engine.dispose()


def test_a_placement_carries_the_jobs_walltime_estimate_or_none(db, tmp_path):
    executor = Executor()
    loop = new_loop(db, tmp_path, executor)
    setup(loop, {"a": None}, quota=8)
    estimated = submit(loop, "a", gpus=2, tier=1, walltime_s=5400.0)
    unknown = submit(loop, "a", gpus=2, tier=1)
    tick(loop)
    assert executor.jobs[estimated].walltime_s == 5400.0
    assert executor.jobs[unknown].walltime_s is None
