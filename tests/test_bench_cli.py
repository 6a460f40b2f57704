"""`arbiter bench` as a user runs it: every requested policy lands in one results directory."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_arbiter.cli.bench import DEFAULT_GAVEL_CLUSTER, default_cluster, gavel_cluster_beside
from gpu_arbiter.domain import InvalidInput

ARBITER = [sys.executable, "-m", "gpu_arbiter.cli"]
TRACES = Path(__file__).resolve().parent / "fixtures" / "traces"
ALL = ("fifo", "backfill", "tiresias", "gavel", "arbiter")
PLOTS = ("jct_cdf.png", "queue_delay_by_tier.png", "utilization_goodput.png")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*ARBITER, *args], capture_output=True, text=True, timeout=120)


def fifo_records(out: Path) -> list[dict[str, str]]:
    """The job records of a bench run's fifo policy."""
    with (out / "fifo" / "records.csv").open() as f:
        return list(csv.DictReader(f))


def assert_complete(out: Path, policies: tuple[str, ...]) -> dict:
    for name in ("results.json", "report.md", *PLOTS):
        assert (out / name).stat().st_size > 0, name
    for name in policies:
        assert (out / name / "records.csv").is_file()
    data = json.loads((out / "results.json").read_text())
    assert list(data["policies"]) == list(policies)
    return data


@pytest.mark.parametrize(
    "args",
    [
        ("--trace", str(TRACES / "openb_pod_list_sample.csv"), "--format", "alibaba-v2023"),
        ("--trace", str(TRACES / "gavel_small_test.trace"), "--format", "gavel"),
        ("--workload", "synthetic:60", "--seed", "2"),
    ],
    ids=["alibaba-v2023", "gavel", "synthetic"],
)
def test_bench_writes_every_file_with_every_policy(tmp_path, args):
    out = run("bench", *args, "--policies", ",".join(ALL), "--out", str(tmp_path / "b"))
    assert out.returncode == 0, out.stderr
    data = assert_complete(tmp_path / "b", ALL)
    report = (tmp_path / "b" / "report.md").read_text()
    assert all(f"]({p})" in report for p in PLOTS)
    if "--trace" in args:
        assert data["trace"]["jobs"] == data["policies"]["fifo"]["jobs"]
        assert "trace read" in report


def test_bench_kpis_are_the_fields_and_values_of_simulate_json(tmp_path):
    workload = ("--workload", "synthetic:60", "--seed", "5", "--cluster", "small")
    out = run("bench", *workload, "--policies", "backfill", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    bench = json.loads((tmp_path / "results.json").read_text())["policies"]["backfill"]
    sim = run("simulate", *workload, "--policy", "backfill", "--json")
    single = json.loads(sim.stdout)
    assert set(bench) == set(single)
    bench.pop("sim_wall_s"), single.pop("sim_wall_s")
    assert bench == single


def test_seeds_replay_each_seed_as_simulate_does_and_report_the_spread(tmp_path):
    workload = ("--workload", "synthetic:40", "--cluster", "small")
    out = run(
        "bench", *workload, "--seed", "5", "--seeds", "2", "--policies", "backfill,arbiter",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "results.json").read_text())
    assert list(data["by_seed"]) == ["5", "6"]
    assert data["policies"] == data["by_seed"]["5"]
    sim = run("simulate", *workload, "--seed", "6", "--policy", "arbiter", "--json")
    single, bench = json.loads(sim.stdout), data["by_seed"]["6"]["arbiter"]
    single.pop("sim_wall_s"), bench.pop("sim_wall_s")
    assert bench == single
    spread = data["across_seeds"]["arbiter"]["mean JCT"]
    jcts = [data["by_seed"][s]["arbiter"]["avg_jct_s"] for s in ("5", "6")]
    assert spread == {"mean": sum(jcts) / 2, "min": min(jcts), "max": max(jcts)}
    assert "## Across seeds 5, 6: mean (min – max)" in (tmp_path / "report.md").read_text()


def test_seeds_below_one_are_refused_before_anything_runs(tmp_path):
    out = run("bench", "--workload", "synthetic:10", "--seeds", "0", "--out", str(tmp_path))
    assert out.returncode == 2
    assert out.stderr.strip() == "arbiter: error: --seeds must be >= 1, got 0"
    assert not (tmp_path / "results.json").exists()


def test_unknown_policies_are_named_in_one_line_and_exit_2(tmp_path):
    out = run(
        "bench",
        "--workload",
        "synthetic:10",
        "--policies",
        "fifo,lottery,srtf",
        "--out",
        str(tmp_path),
    )
    assert out.returncode == 2
    assert "unknown lottery, srtf" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "results.json").exists()


def test_trace_formats_pick_their_own_cluster_unless_told():
    alibaba = TRACES / "openb_pod_list_sample.csv"
    assert default_cluster(alibaba, "alibaba-v2023") == "alibaba-v2023"
    assert default_cluster(TRACES / "gavel_small_test.trace", "gavel") == DEFAULT_GAVEL_CLUSTER
    assert default_cluster(None, None) == "small"


def test_gavel_cluster_comes_from_the_spec_file_one_folder_up(tmp_path):
    (tmp_path / "seed=0").mkdir()
    (tmp_path / "cluster_specs.json").write_text('{"philly": ["500:0:0"]}')
    assert gavel_cluster_beside(tmp_path / "seed=0" / "x.trace") == "gavel:500:0:0"
    (tmp_path / "cluster_specs_heterogeneous.json").write_text('{"philly": ["300:300:300"]}')
    assert gavel_cluster_beside(tmp_path / "seed=0" / "x.trace") == "gavel:300:300:300"
    (tmp_path / "cluster_specs_heterogeneous.json").write_text("[]")
    with pytest.raises(InvalidInput, match="cluster specs"):
        gavel_cluster_beside(tmp_path / "seed=0" / "x.trace")


def test_tier_and_team_choices_decide_who_the_jobs_are_and_the_report_says_so(tmp_path):
    """The Alibaba sample's qos picks tiers unless told otherwise: `--tier-field mix` draws
    every tier from `--tier-mix` (here all tier 3), and `--tier-map` maps qos anew. The
    report and results.json record the choices."""
    alibaba = ("--trace", str(TRACES / "openb_pod_list_sample.csv"), "--format", "alibaba-v2023")
    own = run("bench", *alibaba, "--policies", "fifo", "--out", str(tmp_path / "own"))
    assert own.returncode == 0, own.stderr
    assert len({r["tier"] for r in fifo_records(tmp_path / "own")}) > 1
    out = tmp_path / "all3"
    done = run(
        "bench", *alibaba, "--policies", "fifo", "--tier-field", "mix", "--tier-mix", "0,0,1",
        "--team-field", "gpu_spec", "--walltime", "exact", "--arrival-scale", "0.5",
        "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert {r["tier"] for r in fifo_records(out)} == {"3"}
    data = json.loads((out / "results.json").read_text())["trace"]
    assert data["tiers"] == {"drawn": data["jobs"]}
    assert (data["tier_field"], data["tier_mix"]) == ("mix", [0.0, 0.0, 1.0])
    assert (data["team_field"], data["walltime"]) == ("gpu_spec", "exact")
    assert data["arrival_scale"] == 0.5
    report = (out / "report.md").read_text()
    assert "tiers drawn 0% / 0% / 100% (tiers 1 / 2 / 3); teams by gpu_spec" in report
    assert "- arrival times x0.5" in report
    mapped = tmp_path / "mapped"
    done = run(
        "bench", *alibaba, "--policies", "fifo", "--tier-map", "LS=3,BE=1",
        "--out", str(mapped),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with (TRACES / "openb_pod_list_sample.csv").open() as f:
        qos = {row["name"]: row["qos"] for row in csv.DictReader(f)}
    tiers = {(qos[r["id"]], r["tier"]) for r in fifo_records(mapped)}
    assert {("LS", "3"), ("BE", "1")} <= tiers
    assert not {(q, t) for q, t in tiers if q in ("LS", "BE")} - {("LS", "3"), ("BE", "1")}


@pytest.mark.parametrize(
    "args, message",
    [
        (("--tier-mix", "0.5,0.5,0.5"), "tier_mix must sum to 1"),
        (("--tier-mix", "1,0"), "--tier-mix '1,0': expected three numbers"),
        (("--tier-map", "LS=0"), "expected VALUE=TIER pairs"),
        (("--tier-field", "nope"), "tier_field 'nope' is not a field of this format"),
        (("--tier-field", "gpu_spec"), "tier_field 'gpu_spec' needs a tier_map"),
        (("--tier-field", "mix", "--tier-map", "LS=1"), "a tier_map needs a tier_field"),
        (("--walltime", "daily"), "walltime must be round-hour, exact or none"),
    ],
)
def test_bad_trace_choices_are_refused_before_anything_is_written(tmp_path, args, message):
    alibaba = ("--trace", str(TRACES / "openb_pod_list_sample.csv"), "--format", "alibaba-v2023")
    out = run("bench", *alibaba, *args, "--out", str(tmp_path / "b"))
    assert out.returncode == 2
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "b").exists()
