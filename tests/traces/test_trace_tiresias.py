"""Tiresias job files and cluster specs."""

from pathlib import Path

import pytest

from gpu_arbiter.domain import GPU_CATALOG, InvalidInput
from gpu_arbiter.traces.base import ReadStats, TraceOptions
from gpu_arbiter.traces.tiresias import TIRESIAS_GPU, read_tiresias, tiresias_cluster


def test_a_job_row_maps_to_gpus_submit_and_p100_run_time(traces_dir: Path) -> None:
    jobs = list(read_tiresias(traces_dir / "60_job.csv"))
    assert len(jobs) == len({j.id for j in jobs}) == 60
    job = jobs[1]  # 1,8,30,133,vgg11,147,23
    assert (job.id, job.gpus, job.submit_s, job.gpu_types) == ("tiresias-1", 8, 30, {})
    assert job.duration_s == pytest.approx(147 * TIRESIAS_GPU.speed)


def test_unreadable_rows_are_counted_and_strict_mode_names_them(tmp_path: Path) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text(
        "job_id,num_gpu,submit_time,duration\n"
        "1,1,0,60\n"
        "2,,5,60\n"  # missing num_gpu
        "3,2,10,-4\n"  # negative duration
        "4,0,12,60\n"  # no GPU
        "5,1,15,0\n"  # no run time
    )
    stats = ReadStats(source="t")
    assert [j.id for j in read_tiresias(path, None, stats)] == ["tiresias-1"]
    assert stats.bad_rows == {"num_gpu": [3], "duration": [4]}
    assert dict(stats.skipped) == {"cpu_only": 1, "zero_duration": 1}
    with pytest.raises(InvalidInput, match=r"jobs\.csv: row 3: num_gpu: missing"):
        list(read_tiresias(path, TraceOptions(strict=True)))


def test_cluster_has_one_rack_per_switch(traces_dir: Path) -> None:
    small = tiresias_cluster(traces_dir / "n32g4.csv")  # 1 switch x 32 nodes x 4 GPUs
    assert (len(small.racks), len(small.nodes), small.total_gpus) == (1, 32, 128)
    assert small.gpus_by_type() == {TIRESIAS_GPU.name: 128}
    big = tiresias_cluster(traces_dir / "n160g8.csv")  # 5 x 32 x 8
    assert (len(big.racks), len(big.nodes), big.total_gpus) == (5, 160, 1280)
    assert {n.rack for n in big.nodes if n.name.startswith("switch4-")} == {"switch4"}


def test_cluster_gpu_type_can_be_chosen(traces_dir: Path) -> None:
    cluster = tiresias_cluster(traces_dir / "n32g4.csv", GPU_CATALOG["V100"])
    assert cluster.gpus_by_type() == {"V100": 128}


def test_a_spec_without_counts_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "spec.csv"
    path.write_text("num_switch,num_node_p_switch,num_gpu_p_node\n1,0,4\n")
    with pytest.raises(InvalidInput, match="must all be >= 1"):
        tiresias_cluster(path)
    with pytest.raises(InvalidInput, match="file not found"):
        tiresias_cluster(tmp_path / "nope.csv")
