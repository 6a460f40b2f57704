"""Philly cluster_job_log, decoded one element at a time."""

from pathlib import Path

import pytest

from gpu_arbiter.domain import InvalidInput
from gpu_arbiter.traces import philly
from gpu_arbiter.traces.base import DEFAULT_TEAMS, ReadStats, TraceOptions
from gpu_arbiter.traces.philly import PHILLY_SOURCE_SPEED, read_philly


def read(path: Path, options: TraceOptions | None = None) -> tuple[dict, ReadStats]:
    stats = ReadStats(source="philly")
    return {j.id: j for j in read_philly(path, options, stats)}, stats


def test_jobs_map_gpus_attempts_and_vc(traces_dir: Path) -> None:
    jobs, _ = read(traces_dir / "philly_cluster_job_log.json")
    two_machines = jobs["application_1506638472019_10238"]
    assert (two_machines.gpus, two_machines.team, two_machines.user) == (8, "6214e9", "9a1f3c")
    assert two_machines.duration_s == pytest.approx(3600 * PHILLY_SOURCE_SPEED)
    assert two_machines.submit_s == 4 * 60 + 49  # the earliest submit is 02:00:00
    retried = jobs["application_1506638472019_10239"]
    assert retried.gpus == 1 and retried.submit_s == 0
    assert retried.duration_s == pytest.approx((600 + 1200) * PHILLY_SOURCE_SPEED)


def test_a_job_without_vc_gets_a_hashed_team(traces_dir: Path) -> None:
    jobs, _ = read(traces_dir / "philly_cluster_job_log.json")
    assert jobs["application_1506638472019_10244"].team in DEFAULT_TEAMS
    hashed, _ = read(traces_dir / "philly_cluster_job_log.json", TraceOptions(team_field="hash"))
    assert {j.team for j in hashed.values()} <= set(DEFAULT_TEAMS)


def test_jobs_that_did_not_run_are_skipped_by_reason(traces_dir: Path) -> None:
    jobs, stats = read(traces_dir / "philly_cluster_job_log.json")
    assert len(jobs) == stats.jobs == 3
    assert dict(stats.skipped) == {"never_started": 1, "unfinished": 1, "cpu_only": 1}
    assert stats.bad_rows == {"submitted_time": [6]}
    assert stats.rows == 7


def test_small_chunks_decode_the_same_jobs(traces_dir: Path, monkeypatch) -> None:
    whole, _ = read(traces_dir / "philly_cluster_job_log.json")
    monkeypatch.setattr(philly, "_CHUNK", 7)
    chunked, _ = read(traces_dir / "philly_cluster_job_log.json")
    assert chunked == whole


def test_a_truncated_file_keeps_the_jobs_before_the_cut(traces_dir: Path, tmp_path: Path) -> None:
    text = (traces_dir / "philly_cluster_job_log.json").read_text()
    path = tmp_path / "cut.json"
    path.write_text(text[: text.index("application_1506638472019_10240")])
    jobs, stats = read(path)
    assert len(jobs) == 2
    assert stats.bad_rows == {"json": [3]}
    with pytest.raises(InvalidInput, match=r"cut\.json: row 3: json"):
        read(path, TraceOptions(strict=True))


def test_a_file_that_is_not_an_array_is_one_bad_row(tmp_path: Path) -> None:
    path = tmp_path / "obj.json"
    path.write_text('{"jobid": "x"}')
    jobs, stats = read(path)
    assert not jobs and stats.bad_rows == {"json": [1]}
