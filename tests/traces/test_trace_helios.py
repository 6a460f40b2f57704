"""Helios cluster_log.csv (hand-made fixture in the documented schema)."""

from pathlib import Path

import pytest

from gpu_arbiter.domain import InvalidInput
from gpu_arbiter.traces.base import DEFAULT_TEAMS, ReadStats, TraceOptions
from gpu_arbiter.traces.helios import HELIOS_SOURCE_SPEED, read_helios


def read(path: Path, options: TraceOptions | None = None) -> tuple[dict, ReadStats]:
    stats = ReadStats(source="helios")
    return {j.id: j for j in read_helios(path, options, stats)}, stats


def test_a_row_maps_to_a_job_of_its_vc(traces_dir: Path) -> None:
    jobs, _ = read(traces_dir / "helios_cluster_log.csv")
    job = jobs["helios-1425512"]  # 4 GPUs, 249 s, submitted 26 s after the first job
    assert (job.gpus, job.team, job.user, job.submit_s) == (4, "vchbv", "uVMrF", 26)
    assert job.duration_s == pytest.approx(249 * HELIOS_SOURCE_SPEED)


def test_an_empty_duration_falls_back_to_end_minus_start(traces_dir: Path) -> None:
    jobs, _ = read(traces_dir / "helios_cluster_log.csv")
    assert jobs["helios-1425515"].duration_s == pytest.approx(4 * 3600 * HELIOS_SOURCE_SPEED)


def test_a_job_without_vc_gets_a_hashed_team(traces_dir: Path) -> None:
    jobs, _ = read(traces_dir / "helios_cluster_log.csv")
    assert jobs["helios-1425518"].team in DEFAULT_TEAMS


def test_cpu_jobs_and_bad_rows_are_counted(traces_dir: Path) -> None:
    jobs, stats = read(traces_dir / "helios_cluster_log.csv")
    assert sorted(jobs) == [f"helios-{n}" for n in (1425511, 1425512, 1425513, 1425515, 1425518)]
    assert dict(stats.skipped) == {"cpu_only": 1, "zero_duration": 1}
    assert stats.bad_rows == {"gpu_num": [8], "submit_time": [10]}
    with pytest.raises(InvalidInput, match=r"helios_cluster_log\.csv: row 8: gpu_num"):
        read(traces_dir / "helios_cluster_log.csv", TraceOptions(strict=True))


def test_epoch_second_timestamps_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "cluster_log.csv"
    path.write_text(
        "job_id,vc,gpu_num,submit_time,duration\n1,vcA,1,1591728061,60\n2,vcA,2,1591728121,60\n"
    )
    jobs, _ = read(path)
    assert [j.submit_s for j in jobs.values()] == [0, 60]
