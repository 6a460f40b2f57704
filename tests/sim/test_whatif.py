"""`arbiter whatif` on a small history: one column per change, and bad input in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_arbiter.cli.whatif import moved, with_cloud
from gpu_arbiter.domain import InvalidInput
from gpu_arbiter.economy import TcoConfig
from gpu_arbiter.engine import EngineConfig
from gpu_arbiter.sim.whatif import BASELINE, Scenario, replay
from gpu_arbiter.traces.arbiter_history import history_cluster, history_teams
from gpu_arbiter.traces.registry import read_trace

HISTORY = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "arbiter_history.jsonl"
TCO = Path(__file__).resolve().parents[2] / "src/gpu_arbiter/examples/tco-h100-1024.yaml"


@pytest.fixture(scope="module")
def base() -> Scenario:
    cluster = history_cluster(HISTORY)
    jobs = list(read_trace(HISTORY, "arbiter")[0])
    return Scenario(BASELINE, cluster, history_teams(HISTORY, cluster), "arbiter", jobs)


def test_moving_a_team_to_slower_gpus_makes_its_jobs_run_longer(base: Scenario) -> None:
    tco, engine = TcoConfig.from_yaml(TCO), EngineConfig(restart_overhead_s=0.0)
    before = replay(base, tco, engine)
    after = replay(moved(base, "ads:A100"), tco, engine)
    assert all(dict(j.gpu_types) == {"A100": 0.87} for j in moved(base, "ads:A100").jobs
               if j.team == "ads")  # fmt: skip
    assert after["by_team"]["ads"]["mean_jct_s"] > before["by_team"]["ads"]["mean_jct_s"]
    assert after["work_done_h100_gpu_hours"] == pytest.approx(before["work_done_h100_gpu_hours"])
    assert set(after["spend_by_team"]) == {"ads", "llm"}


def test_rented_cloud_gpus_are_added_in_a_rack_of_their_own_and_paid_every_hour(
    base: Scenario,
) -> None:
    cloud = with_cloud(base, "12:H100:2.5")
    assert cloud.cluster.gpus_by_type()["H100"] == 16 + 12
    assert sorted(n.gpus for n in cloud.cluster.nodes if n.rack == "cloud") == [4, 8]
    figures = replay(cloud, TcoConfig.from_yaml(TCO), EngineConfig())
    assert figures["cloud_rent"] == pytest.approx(12 * 2.5 * figures["makespan_s"] / 3600)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: moved(b, "ads"), "expected TEAM:TYPE"),
        (lambda b: moved(b, "ads:B200"), "the cluster has no B200"),
        (lambda b: moved(b, "search:H100"), "no job of team 'search'"),
        (lambda b: with_cloud(b, "many:H100:2"), "expected N:TYPE:PRICE"),
        (lambda b: with_cloud(b, "0:H100:2"), "N must be >= 1"),
        (lambda b: with_cloud(b, "8:TPU:2"), "unknown GPU type TPU"),
    ],
)
def test_a_bad_change_is_refused(base: Scenario, change, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        change(base)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_arbiter.cli", "whatif", *args],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_whatif_writes_one_column_per_change(tmp_path: Path) -> None:
    out = tmp_path / "w"
    done = run("--history", str(HISTORY), "--policy", "fifo", "--move", "ads:A100",
               "--add-cloud", "8:H100:3", "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads((out / "results.json").read_text())
    assert doc["kind"] == "whatif"
    assert list(doc["columns"]) == [BASELINE, "policy fifo", "move ads:A100", "add-cloud 8:H100:3"]
    report = (out / "report.md").read_text()
    assert "| spend, team ads |" in report and "cost per useful GPU-hour" in report


@pytest.mark.parametrize(
    "args",
    [
        ("--history", "no-such-file.jsonl"),
        ("--history", str(HISTORY), "--move", "ads:TPU"),
        ("--history", str(HISTORY), "--policy", "lottery"),
        ("--history", str(TCO)),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path: Path, args: tuple[str, ...]) -> None:
    done = run(*args, "--out", str(tmp_path / "w"))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "w").exists()


def test_simulate_replays_a_history_on_its_own_cluster_and_says_how_close_it_came() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpu_arbiter.cli", "simulate", "--trace", str(HISTORY),
         "--format", "arbiter", "--cluster", "history", "--no-failures", "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    kpis = json.loads(done.stdout)
    assert (kpis["cluster"], kpis["gpus"], kpis["completed"]) == ("history", 24, 3)
    fidelity = kpis["queueing_real_vs_replayed"]
    assert fidelity["real"] == pytest.approx({"jobs": 3, "mean_s": 85 / 3, "p99_s": 78.5})
    assert "queueing, real vs replayed: mean 28.3 s" in done.stderr
