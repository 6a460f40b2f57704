"""Formats by name: `read_trace` and its eager checks."""

from pathlib import Path

import pytest

from gpu_arbiter.domain import InvalidInput
from gpu_arbiter.traces.registry import FORMATS, read_trace

FIXTURE_BY_FORMAT = {
    "alibaba-v2023": "openb_pod_list_sample.csv",
    "tiresias": "60_job.csv",
    "gavel": "gavel_small_test.trace",
    "philly": "philly_cluster_job_log.json",
    "helios": "helios_cluster_log.csv",
    "pai2020": "pai",
    "arbiter": "arbiter_history.jsonl",
}


def test_every_format_is_registered_under_its_cli_name() -> None:
    assert set(FORMATS) == set(FIXTURE_BY_FORMAT)


@pytest.mark.parametrize("fmt", sorted(FIXTURE_BY_FORMAT))
def test_each_format_reads_its_fixture_and_stats_fill_while_reading(
    fmt: str, traces_dir: Path
) -> None:
    jobs, stats = read_trace(traces_dir / FIXTURE_BY_FORMAT[fmt], fmt)
    assert stats.rows == 0
    first = next(jobs)
    assert stats.jobs == 1 and first.submit_s >= 0 and first.duration_s > 0
    rest = list(jobs)
    assert stats.jobs == 1 + len(rest)
    assert len({first.id, *(j.id for j in rest)}) == stats.jobs


def test_an_unknown_format_lists_the_known_ones(traces_dir: Path) -> None:
    with pytest.raises(InvalidInput, match="known: alibaba-v2023, arbiter, gavel, helios, pai2020"):
        read_trace(traces_dir / "60_job.csv", "slurm")


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="file not found: .*nope.csv"):
        read_trace(tmp_path / "nope.csv", "helios")
