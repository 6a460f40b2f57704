"""Alibaba cluster-trace-gpu-v2023: pods to jobs, and the real node list to a cluster."""

import csv
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from gpu_arbiter.domain import GpuType, InvalidInput, Tier
from gpu_arbiter.traces.alibaba import (
    ALIBABA_GPU_TYPES,
    ALIBABA_SOURCE_SPEED,
    NODES_PER_RACK,
    alibaba_cluster,
    read_alibaba,
)
from gpu_arbiter.traces.base import ReadStats, TraceOptions
from gpu_arbiter.traces.hardware import POWER_HEADROOM


@pytest.fixture
def pods(traces_dir: Path) -> dict:
    return {j.id: j for j in read_alibaba(traces_dir / "openb_pod_list_sample.csv")}


def test_a_pod_maps_to_a_job_in_reference_seconds(pods: dict) -> None:
    job = pods["openb-pod-0017"]  # 8 x G2, Burstable, scheduled 9437497, deleted 10769854
    g2 = ALIBABA_GPU_TYPES["G2"].speed
    assert (job.gpus, job.gpu_milli, job.tier) == (8, 1000, Tier.BUSINESS)
    assert job.gpu_types == {"G2": g2}
    assert job.duration_s == pytest.approx((10769854 - 9437497) * g2)
    assert job.submit_s == 9437497  # the trace starts at creation time 0
    assert job.team.startswith("team-") and job.user is None


def test_qos_picks_the_tier(pods: dict) -> None:
    assert pods["openb-pod-0000"].tier == Tier.CORE  # LS
    assert pods["openb-pod-0129"].tier == Tier.CORE  # Guaranteed
    assert pods["openb-pod-0022"].tier == Tier.EXPLORATORY  # BE


def test_a_gpu_share_on_one_gpu_is_a_fractional_job(pods: dict) -> None:
    job = pods["openb-pod-0001"]
    assert (job.gpus, job.gpu_milli) == (1, 460)


def test_gpu_spec_limits_the_accepted_models_and_sets_the_source_speed(pods: dict) -> None:
    wide = pods["openb-pod-0021"]  # G2|P100|T4|V100M16|V100M32, 440 milli
    assert set(wide.gpu_types) == {"G2", "P100", "T4", "V100M16", "V100M32"}
    assert wide.gpu_types["T4"] == ALIBABA_GPU_TYPES["T4"].speed
    mean = sum(wide.gpu_types.values()) / 5
    assert wide.duration_s == pytest.approx((12902960 - 9671708) * mean)
    repeated = pods["openb-pod-0527"]  # "V100M16|V100M32|V100M32"
    assert list(repeated.gpu_types) == ["V100M16", "V100M32"]
    assert pods["openb-pod-0000"].gpu_types == {}  # no spec: any model


def test_a_pod_never_scheduled_runs_from_its_creation(pods: dict) -> None:
    job = pods["openb-pod-0061"]  # Pending: created 10001278, deleted 10001403
    assert job.duration_s == pytest.approx(125 * ALIBABA_SOURCE_SPEED)


def test_cpu_only_and_zero_duration_pods_are_counted_not_replayed(traces_dir: Path) -> None:
    stats = ReadStats(source="sample")
    got = list(read_alibaba(traces_dir / "openb_pod_list_sample.csv", None, stats))
    with (traces_dir / "openb_pod_list_sample.csv").open() as f:
        rows = list(csv.DictReader(f))
    cpu_only = sum(r["num_gpu"] == "0" for r in rows)
    assert stats.skipped == Counter(cpu_only=cpu_only, zero_duration=1)  # pod-7285
    assert stats.rows == len(rows) and stats.jobs == len(got) == len(rows) - cpu_only - 1
    assert not stats.bad


def test_bad_rows_are_counted_with_their_row_numbers(traces_dir: Path) -> None:
    stats = ReadStats(source="bad")
    got = list(read_alibaba(traces_dir / "openb_pod_list_bad.csv", None, stats))
    assert [j.id for j in got] == ["openb-pod-0000", "openb-pod-0017"]
    assert stats.bad_rows == {
        "columns": [3],
        "num_gpu": [4],
        "gpu_spec": [5],
        "deletion_time": [6],
        "gpu_milli": [7],
        "id": [9],
    }
    assert "6 bad" in stats.summary()


def test_strict_mode_raises_on_the_first_bad_row(traces_dir: Path) -> None:
    path = traces_dir / "openb_pod_list_bad.csv"
    with pytest.raises(InvalidInput, match=r"openb_pod_list_bad\.csv: row 3: columns"):
        list(read_alibaba(path, TraceOptions(strict=True)))


def test_a_pod_list_without_times_and_without_a_default_list_is_refused(
    traces_dir: Path,
) -> None:
    missing = re.escape(f"and no {traces_dir / 'openb_pod_list_default.csv'} beside it")
    with pytest.raises(
        InvalidInput, match=f"missing columns qos, creation_time, deletion_time, {missing}"
    ):
        read_alibaba(traces_dir / "openb_pod_list_multigpu_head.csv")


MULTIGPU = "openb_pod_list_multigpu20.csv"
ADDED = ["openb-pod-8318", "openb-pod-8319", "openb-pod-8320", "openb-pod-8321"]
ADDED += ["openb-pod-8322", "openb-pod-8323", "openb-pod-9000"]
RESIZED = "openb-pod-0128"  # named in the default list with other resources


def _read(folder: Path, name: str, seed: int = 0) -> tuple[dict, ReadStats]:
    stats = ReadStats(source=name)
    jobs = read_alibaba(folder / name, TraceOptions(seed=seed), stats)
    return {j.id: j for j in jobs}, stats


def _times(job) -> tuple:
    return (job.submit_s, job.duration_s, job.tier)


def test_pods_of_the_default_list_take_its_times_by_name(traces_dir: Path) -> None:
    folder = traces_dir / "openb_multigpu"
    own, _ = _read(folder, "openb_pod_list_default.csv")
    sampled, _ = _read(folder, MULTIGPU)
    matched = set(sampled) - set(ADDED) - {RESIZED}
    assert matched == {"openb-pod-0000", "openb-pod-0001", "openb-pod-0002", "openb-pod-0003"} | {
        "openb-pod-0004",
        "openb-pod-0006",
        "openb-pod-0017",
        "openb-pod-0422",
        "openb-pod-2182",
    }  # pod-0005 is CPU-only
    for name in matched:
        assert sampled[name] == own[name]
    assert sampled["openb-pod-0017"].tier == Tier.BUSINESS  # Burstable, from the default list


def test_other_pods_draw_their_times_from_default_pods_of_their_gpu_count(
    traces_dir: Path,
) -> None:
    folder = traces_dir / "openb_multigpu"
    own, _ = _read(folder, "openb_pod_list_default.csv")
    by_gpus: dict[int, set] = {}
    for job in own.values():  # jobs only: the zero-duration pod-7285 is none
        by_gpus.setdefault(job.gpus, set()).add(_times(job))
    runs = [_read(folder, MULTIGPU, seed)[0] for seed in (0, 0, 1)]
    for jobs in runs:
        for name in [*ADDED, RESIZED]:
            assert _times(jobs[name]) in by_gpus[jobs[name].gpus], name
    assert jobs["openb-pod-8320"].gpus == 4 and jobs["openb-pod-8322"].gpus == 2
    drawn = [{n: _times(jobs[n]) for n in [*ADDED, RESIZED]} for jobs in runs]
    assert drawn[0] == drawn[1]  # the same seed draws the same times
    assert drawn[0] != drawn[2]


def test_the_read_summary_says_where_the_times_came_from(traces_dir: Path) -> None:
    _, stats = _read(traces_dir / "openb_multigpu", MULTIGPU)
    assert stats.times == Counter(
        {
            "taken by name from openb_pod_list_default.csv": 9,
            "drawn by GPU count from openb_pod_list_default.csv": 8,
        }
    )
    assert stats.summary().endswith(
        "; times 9 taken by name from openb_pod_list_default.csv, "
        "8 drawn by GPU count from openb_pod_list_default.csv"
    )
    _, own = _read(traces_dir / "openb_multigpu", "openb_pod_list_default.csv")
    assert not own.times and "times" not in own.summary()


def test_a_pod_whose_gpu_count_no_default_pod_has_is_a_bad_row(
    traces_dir: Path, tmp_path: Path
) -> None:
    for name in ("openb_pod_list_default.csv", MULTIGPU):
        shutil.copy(traces_dir / "openb_multigpu" / name, tmp_path / name)
    with (tmp_path / MULTIGPU).open("a") as f:
        f.write("openb-pod-9001,24000,98304,3,1000\n")
    jobs, stats = _read(tmp_path, MULTIGPU)
    assert "openb-pod-9001" not in jobs and stats.bad_rows == {"num_gpu": [20]}
    assert stats.bad_first["num_gpu"] == "no pod of the default list with 3 GPU(s) to draw from"


def test_cluster_matches_the_real_node_list(traces_dir: Path) -> None:
    path = traces_dir / "openb_node_list_gpu_node.csv"
    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if int(r["gpu"]) > 0]
    per_model = Counter()
    for r in rows:
        per_model[r["model"]] += int(r["gpu"])
    cluster = alibaba_cluster(path)
    assert len(cluster.nodes) == len(rows) == 1213
    assert cluster.total_gpus == sum(per_model.values())
    assert cluster.gpus_by_type() == dict(per_model)
    assert cluster.node("openb-node-0000").gpus == int(rows[0]["gpu"])


def test_racks_hold_up_to_16_nodes_of_one_model_with_generous_power(traces_dir: Path) -> None:
    cluster = alibaba_cluster(traces_dir / "openb_node_list_gpu_node.csv")
    members: dict[str, list] = {}
    for node in cluster.nodes:
        members.setdefault(node.rack, []).append(node)
    for rack, nodes in members.items():
        assert 1 <= len(nodes) <= NODES_PER_RACK
        assert {n.gpu_type for n in nodes} == {rack.split("-r")[0]}
        draw = sum(n.idle_power_w + n.gpus * cluster.gpu_types[n.gpu_type].power_w for n in nodes)
        assert cluster.racks[rack].power_cap_w == pytest.approx(POWER_HEADROOM * draw)
    assert len(members["G2-r00"]) == NODES_PER_RACK
    assert alibaba_cluster(traces_dir / "openb_node_list_gpu_node.csv").nodes == cluster.nodes


def test_gpu_type_figures_can_be_overridden(traces_dir: Path) -> None:
    faster = GpuType("G2", speed=0.87, power_w=400, memory_gib=80)
    cluster = alibaba_cluster(traces_dir / "openb_node_list_gpu_node.csv", {"G2": faster})
    assert cluster.gpu_types["G2"] == faster


def test_a_node_of_an_unknown_model_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1024,8,H800\n")
    with pytest.raises(InvalidInput, match="row 2: model: unknown GPU model 'H800'"):
        alibaba_cluster(path)


def test_a_fraction_keeps_every_model_at_a_smaller_size(traces_dir: Path) -> None:
    full = alibaba_cluster(traces_dir / "openb_node_list_gpu_node.csv")
    part = alibaba_cluster(traces_dir / "openb_node_list_gpu_node.csv", fraction=0.02)
    assert part.name == "alibaba-v2023@0.02"
    assert set(part.gpus_by_type()) == set(full.gpus_by_type())  # at least one node per model
    assert part.total_gpus < full.total_gpus / 10
    with pytest.raises(InvalidInput, match="fraction must be in"):
        alibaba_cluster(traces_dir / "openb_node_list_gpu_node.csv", fraction=0)


def test_simulate_prints_where_the_times_came_from_or_refuses_in_one_line(
    traces_dir: Path,
) -> None:
    def simulate(trace: Path) -> subprocess.CompletedProcess:
        args = ["simulate", "--trace", str(trace), "--format", "alibaba-v2023", "--policy", "fifo"]
        return subprocess.run(
            [sys.executable, "-m", "gpu_arbiter.cli", *args],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )

    done = simulate(traces_dir / "openb_multigpu" / MULTIGPU)
    assert done.returncode == 0, done.stderr
    assert (
        "times 9 taken by name from openb_pod_list_default.csv, "
        "8 drawn by GPU count from openb_pod_list_default.csv"
    ) in done.stderr
    refused = simulate(traces_dir / "openb_pod_list_multigpu_head.csv")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "missing columns qos, creation_time, deletion_time, and no " in refused.stderr
    assert "openb_pod_list_default.csv beside it" in refused.stderr
