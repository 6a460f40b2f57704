"""PAI 2020 job and task tables (hand-made fixture in the documented columns)."""

from pathlib import Path

import pytest

from gpu_arbiter.domain import InvalidInput
from gpu_arbiter.traces.base import ReadStats, TraceOptions
from gpu_arbiter.traces.pai import PAI_SOURCE_SPEEDS, read_pai

J1 = "4f057009a5d481acec67b088"
J2 = "a3b1c2d4e5f60718293a4b5c"
J6 = "f0e1d2c3b4a5968778695a4b"


def read(path: Path, options: TraceOptions | None = None) -> tuple[dict, ReadStats]:
    stats = ReadStats(source="pai")
    return {j.id: j for j in read_pai(path, options, stats)}, stats


def test_tasks_add_up_to_the_job_gpus_and_span(traces_dir: Path) -> None:
    jobs, _ = read(traces_dir / "pai")
    job = jobs[J1]  # 4 V100 workers at 100% and a CPU parameter server
    assert (job.gpus, job.gpu_milli, job.user, job.submit_s) == (4, 1000, "58540f191766", 0)
    assert job.duration_s == pytest.approx((1004650 - 1001000) * PAI_SOURCE_SPEEDS["V100"])
    assert job.gpu_types == {}  # the trace says where tasks ran, not what they required


def test_less_than_one_gpu_is_a_fractional_job(traces_dir: Path) -> None:
    jobs, _ = read(traces_dir / "pai")
    assert (jobs[J2].gpus, jobs[J2].gpu_milli) == (1, 500)
    assert jobs[J2].duration_s == pytest.approx(1700 * PAI_SOURCE_SPEEDS["T4"])


def test_shares_above_one_gpu_round_up_and_the_largest_task_sets_the_type(traces_dir: Path) -> None:
    jobs, _ = read(traces_dir / "pai")
    job = jobs[J6]  # 2 x 50% P100 workers and a 25% T4 evaluator
    assert (job.gpus, job.gpu_milli) == (2, 1000)
    assert job.duration_s == pytest.approx((1008900 - 1003600) * PAI_SOURCE_SPEEDS["P100"])


def test_skips_and_bad_rows_of_both_tables_are_counted(traces_dir: Path) -> None:
    jobs, stats = read(traces_dir / "pai" / "pai_job_table.csv")
    assert sorted(jobs) == sorted([J1, J2, J6])
    assert dict(stats.skipped) == {"cpu_only": 1, "no_tasks": 2, "unfinished": 1}
    assert stats.bad_rows == {"start_time": [7], "task.plan_gpu": [9]}
    with pytest.raises(InvalidInput, match=r"pai_task_table\.csv: row 9: plan_gpu"):
        read(traces_dir / "pai", TraceOptions(strict=True))


def test_a_missing_task_table_is_named(tmp_path: Path, traces_dir: Path) -> None:
    job_table = tmp_path / "pai_job_table.csv"
    job_table.write_text((traces_dir / "pai" / "pai_job_table.csv").read_text())
    with pytest.raises(InvalidInput, match="pai_task_table.csv"):
        read_pai(job_table)
