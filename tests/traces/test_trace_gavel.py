"""Gavel traces: steps to run time through the throughput table, and "v100:p100:k80" clusters."""

from pathlib import Path

import pytest

from gpu_arbiter.cli.inputs import load_inputs
from gpu_arbiter.domain import InvalidInput, Tier
from gpu_arbiter.traces.base import ReadStats, TraceOptions
from gpu_arbiter.traces.gavel import (
    DURATION_WARNING,
    THROUGHPUTS,
    V100,
    gavel_cluster,
    read_gavel,
    throughput,
)


def test_a_ten_field_line_becomes_a_job_sized_by_v100_throughput(traces_dir: Path) -> None:
    jobs = list(read_gavel(traces_dir / "gavel_small_test.trace"))
    assert len(jobs) == 20
    job = jobs[0]  # Transformer (batch size 128), 346 steps, scale 2
    v100, p100, k80 = THROUGHPUTS["Transformer (batch size 128)"]
    assert (job.id, job.gpus, job.submit_s) == ("gavel-1", 2, 0)
    assert job.duration_s == pytest.approx(346 / (v100 * 2) * V100.speed)
    assert job.gpu_types == pytest.approx(
        {"V100": V100.speed, "P100": V100.speed * p100 / v100, "K80": V100.speed * k80 / v100}
    )
    assert job.command is not None and job.command.startswith("python3 train.py")


def test_a_seven_field_msr_line_reads_arrival_and_scale(traces_dir: Path) -> None:
    jobs = list(read_gavel(traces_dir / "gavel_msr_0e4a51_head.trace"))
    assert len(jobs) == 50
    assert [j.submit_s for j in jobs[:3]] == [0, 6, 6]
    assert jobs[36].gpus == 4  # line 37: ResNet-18 (batch size 128), scale 4


def test_a_job_too_big_for_a_k80_does_not_accept_it(traces_dir: Path) -> None:
    jobs = list(read_gavel(traces_dir / "gavel_msr_0e4a51_head.trace"))
    big = jobs[47]  # line 48: ResNet-50 (batch size 128)
    assert set(big.gpu_types) == {"V100", "P100"}


def test_priority_weight_sets_the_tier(traces_dir: Path) -> None:
    jobs = {j.id: j for j in read_gavel(traces_dir / "gavel_bad.trace")}
    assert jobs["gavel-1"].tier == Tier.CORE  # weight 2
    assert jobs["gavel-2"].tier == Tier.EXPLORATORY  # weight 0.5


def test_bad_lines_are_counted_and_unlisted_batch_sizes_use_the_nearest(traces_dir: Path) -> None:
    stats = ReadStats(source="g")
    jobs = list(read_gavel(traces_dir / "gavel_bad.trace", None, stats))
    assert [j.id for j in jobs] == ["gavel-1", "gavel-2", "gavel-6"]
    assert stats.bad_rows == {"job_type": [3], "columns": [4], "scale_factor": [5]}
    assert throughput("ResNet-18 (batch size 48)") == THROUGHPUTS["ResNet-18 (batch size 64)"]
    with pytest.raises(InvalidInput, match=r"gavel_bad\.trace: row 3: job_type"):
        list(read_gavel(traces_dir / "gavel_bad.trace", TraceOptions(strict=True)))


def test_cluster_packs_each_type_into_8_gpu_nodes_and_8_node_racks() -> None:
    cluster = gavel_cluster("300:300:300")
    assert cluster.gpus_by_type() == {"V100": 300, "P100": 300, "K80": 300}
    v100 = [n for n in cluster.nodes if n.gpu_type == "V100"]
    assert [n.gpus for n in v100] == [8] * 37 + [4]
    assert len({n.rack for n in v100}) == 5
    assert gavel_cluster("500:0:0").total_gpus == 500


@pytest.mark.parametrize("spec", ["500:0", "a:b:c", "0:0:0", "-8:0:8"])
def test_a_malformed_cluster_spec_is_refused(spec: str) -> None:
    with pytest.raises(InvalidInput, match="v100:p100:k80"):
        gavel_cluster(spec)


def test_a_fork_layout_with_a_mode_column_reads_it_as_a_field(traces_dir: Path) -> None:
    jobs = list(read_gavel(traces_dir / "gavel_fork_mode.trace"))
    assert [(j.id, j.gpus, j.submit_s) for j in jobs] == [
        ("gavel-1", 2, 0),
        ("gavel-2", 2, 30),
        ("gavel-3", 1, 60),
    ]
    v100 = THROUGHPUTS["Transformer (batch size 128)"][0]
    assert jobs[0].duration_s == pytest.approx(346 / (v100 * 2) * V100.speed)
    assert jobs[2].tier == Tier.CORE  # priority weight 2 sits after the mode column
    by_mode = read_gavel(
        traces_dir / "gavel_fork_mode.trace",
        TraceOptions(team_field="mode"),
    )
    assert [j.team for j in by_mode] == ["static", "accordion", "gns"]


def test_a_fork_layout_with_durations_uses_them_and_warns_where_steps_disagree(
    traces_dir: Path,
) -> None:
    stats = ReadStats(source="g")
    jobs = list(read_gavel(traces_dir / "gavel_fork_duration.trace", None, stats))
    assert [j.duration_s / V100.speed for j in jobs] == pytest.approx([60, 50, 3600, 100])
    assert stats.bad_rows == {"duration": [5]}
    # Rows 3 and 4 are 60x and 20x off the run time their steps give; row 2's 1.7x is not.
    assert stats.warned_rows == {DURATION_WARNING: [3, 4]}
    assert stats.summary().endswith(
        "; WARNING: 2 jobs have a duration over 2x off the run time their steps give (rows 3, 4)"
    )


def test_a_file_no_row_of_which_has_a_known_layout_says_what_was_expected(
    traces_dir: Path,
) -> None:
    stats = ReadStats(source="g")
    assert list(read_gavel(traces_dir / "gavel_wrong_columns.trace", None, stats)) == []
    assert stats.summary() == (
        "g: 3 rows, 0 jobs, 0 skipped, 3 bad (columns 3: rows 1, 2, 3 (expected 10 (Gavel), "
        "7 (msr), 11 or 12 (forks with mode, duration) tab-separated fields, got 9))"
    )
    with pytest.raises(InvalidInput, match="tab-separated fields, got 9"):
        load_inputs("gavel:36:36:36", trace=traces_dir / "gavel_wrong_columns.trace", fmt="gavel")
