"""The `arbiter` command as a user runs it: one JSON object, one-line errors, exit codes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ARBITER = [sys.executable, "-m", "gpu_arbiter.cli"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*ARBITER, *args], capture_output=True, text=True, timeout=120)


def test_simulate_json_has_the_promised_fields():
    out = run(
        "simulate",
        "--workload",
        "synthetic:150",
        "--seed",
        "4",
        "--policy",
        "arbiter",
        "--cluster",
        "small",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    kpis = json.loads(out.stdout)
    for field in (
        "policy",
        "jobs",
        "completed",
        "avg_jct_s",
        "p50_jct_s",
        "p99_jct_s",
        "p99_queue_delay_s_by_tier",
        "utilization",
        "goodput",
        "preemptions",
        "fragmentation",
        "tier1_preempted",
        "sim_wall_s",
    ):
        assert field in kpis
    assert set(kpis["p99_queue_delay_s_by_tier"]) == {"1", "2", "3"}
    assert kpis["jobs"] == kpis["completed"] == 150
    assert kpis["tier1_preempted"] == 0


def test_same_seed_same_result_apart_from_wall_time():
    a = json.loads(run("simulate", "--workload", "synthetic:120", "--seed", "9", "--json").stdout)
    b = json.loads(run("simulate", "--workload", "synthetic:120", "--seed", "9", "--json").stdout)
    a.pop("sim_wall_s"), b.pop("sim_wall_s")
    assert a == b


@pytest.mark.parametrize(
    "args, message",
    [
        (("--policy", "nope"), "unknown policy 'nope'"),
        (("--workload", "synthetic:0"), "N must be > 0"),
        (("--workload", "synthetic:-3"), "N must be > 0"),
        (("--cluster", "no-such-preset"), "unknown cluster"),
        (("--notice-stop", "-5"), "--notice-stop must be a number of seconds >= 0"),
        (("--degraded-slowdown", "0.5"), "degraded_slowdown must be >= 1"),
        (("--degraded-afr", "-1"), "degraded_afr must be >= 0"),
        (("--straggler-factor", "1"), "factor must be > 1"),
    ],
)
def test_bad_input_is_one_line_and_non_zero(args, message):
    out = run("simulate", *args, "--json")
    assert out.returncode != 0
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_malformed_cluster_yaml_names_the_problem(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("racks: [\n  {name: r0\n")
    out = run("simulate", "--cluster", str(bad), "--json")
    assert out.returncode == 2
    assert "malformed YAML" in out.stderr and "Traceback" not in out.stderr


def test_cluster_yaml_with_a_bad_field_names_it(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("racks:\n  - {name: r0, nodes: 2, gpu_type: H100, gpus_per_node: -1}\n")
    out = run("simulate", "--cluster", str(bad), "--json")
    assert out.returncode == 2
    assert "gpus_per_node" in out.stderr


def test_job_bigger_than_the_cluster_is_refused(tmp_path):
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(
        "racks:\n  - {name: r0, nodes: 1, gpu_type: P100, gpus_per_node: 2}\n"
        "gpu_types:\n  - {name: P100, speed: 0.2, power_w: 250}\n"
    )
    trace = tmp_path / "jobs.csv"
    trace.write_text(
        "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
        "0,1,0,606,vgg19,164,30\n1,8,30,133,vgg11,147,23\n"
    )
    out = run(
        "simulate", "--cluster", str(tiny), "--trace", str(trace), "--format", "tiresias", "--json"
    )
    assert out.returncode == 2
    assert "needs 8 GPUs" in out.stderr and "Traceback" not in out.stderr


def test_simulate_reads_a_trace_with_the_tiers_the_options_ask_for():
    """Tiresias' format has no tier: `--tier-field` names a column and `--tier-map` maps its
    values; the rest is drawn from `--tier-mix` (here all tier 3)."""
    trace = Path(__file__).parent / "fixtures" / "traces" / "60_job.csv"
    out = run(
        "simulate", "--trace", str(trace), "--format", "tiresias", "--cluster", "small",
        "--tier-field", "model_name", "--tier-map", "vgg19=1,alexnet=2", "--tier-mix", "0,0,1",
        "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    by_tier = {t: v["jobs"] for t, v in json.loads(out.stdout)["jct_by_tier"].items()}
    assert by_tier == {"1": 6, "2": 6, "3": 48}


def test_simulate_injects_degraded_nodes_only_when_asked():
    args = ("simulate", "--workload", "synthetic:150", "--seed", "2", "--json")
    plain = json.loads(run(*args).stdout)
    assert "degraded_nodes" not in plain
    slow = json.loads(run(*args, "--degraded-afr", "50").stdout)
    assert slow["degraded_nodes"] > 0 and "straggler_slow_gpu_hours" in slow


def test_simulate_sets_gavels_allocation_reset_interval():
    def avg_jct(*reset: str) -> float:
        args = ("--workload", "synthetic:150", "--seed", "3", "--load", "1.5", "--no-failures")
        out = run("simulate", "--policy", "gavel", *args, *reset, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["avg_jct_s"]

    default = avg_jct()
    assert avg_jct("--gavel-reset", "1920") == default  # Gavel's own default
    assert avg_jct("--gavel-reset", "0") != default  # the LP recomputed every round
    for bad, words in ((("--policy", "fifo", "--gavel-reset", "0"), "gavel only"),
                       (("--policy", "gavel", "--gavel-reset", "-1"), ">= 0")):  # fmt: skip
        out = run("simulate", "--workload", "synthetic:10", *bad)
        assert out.returncode == 2 and words in out.stderr and len(out.stderr.splitlines()) == 1
