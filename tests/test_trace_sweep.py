"""`python -m bench.trace_sweep`: every policy on every trace of a folder, with verdicts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench.trace_sweep import judge, main, verdict
from gpu_arbiter.sim.report import KPIS, best_policies

FIXTURES = Path(__file__).parent / "fixtures" / "traces"


def test_verdicts_compare_with_the_best_baseline() -> None:
    row = {
        "policies": {
            "fifo": {"avg_jct_h": 5.0, "tier1_p99_queue_min": 0.0},
            "gavel": {"avg_jct_h": 3.0, "tier1_p99_queue_min": 9.0},
            "arbiter": {"avg_jct_h": 3.3, "tier1_p99_queue_min": 0.0},
        }
    }
    assert judge(row, "avg_jct_h") == ("LOSS", 3.3, "gavel", 3.0)
    assert judge(row, "tier1_p99_queue_min") == ("TIE", 0.0, "fifo", 0.0)
    assert verdict(1.0, 2.0) == "WIN"
    assert judge({"error": "too big"}, "avg_jct_h") is None


def test_the_sweep_and_the_bench_report_call_the_same_near_equal_values_a_tie() -> None:
    """Means over seeds differ in the last bits; the sweep's verdict and the report's best
    column must not disagree on who won."""
    kpis = {"gavel": {"avg_jct_s": 36000.0}, "arbiter": {"avg_jct_s": 36000.0 * (1 + 1e-8)}}
    mean_jct = next(k for k in KPIS if k.label == "mean JCT")
    assert best_policies(mean_jct, kpis) == ["gavel", "arbiter"]
    assert verdict(10.0 * (1 + 1e-8), 10.0) == "TIE"
    assert verdict(10.0 * (1 + 1e-4), 10.0) == "LOSS"


def test_sweep_writes_every_trace_and_policy(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    (folder / "sub").mkdir(parents=True)
    shutil.copy(FIXTURES / "gavel_small_test.trace", folder / "a.trace")
    shutil.copy(FIXTURES / "gavel_msr_0e4a51_head.trace", folder / "sub" / "b.trace")
    out = tmp_path / "out"
    # 2 GPUs of each type: the 4-GPU jobs of b.trace cannot run there, those of a.trace can.
    argv = [str(folder), "--out", str(out), "--workers", "1", "--cluster", "gavel:2:2:2"]
    main([*argv, "--seed", "3", "--seeds", "2"])
    data = json.loads((out / "sweep.json").read_text())
    assert data["seeds"] == [3, 4]
    a, b = data["traces"]
    assert (a["trace"], b["trace"]) == ("a.trace", "sub/b.trace")
    assert set(a["policies"]) == {"fifo", "backfill", "tiresias", "gavel", "arbiter"}
    for kpis in a["policies"].values():  # the KPI is the mean of the seeds' values
        runs = kpis["avg_jct_h_by_seed"]
        assert len(runs) == 2 and min(runs) > 0
        assert kpis["avg_jct_h"] == pytest.approx(sum(runs) / 2)
        assert len(kpis["tier1_mean_jct_h_by_seed"]) == 2
    assert "needs 4 GPUs" in b["error"] and "policies" not in b
    report = (out / "sweep.md").read_text()
    table = [line for line in report.splitlines() if line.startswith("|")]
    assert "| tier-1 mean JCT | Arbiter vs best |" in table[0]
    assert {line.count("|") for line in table} == {table[0].count("|")}  # errors fill every cell
    assert "| a.trace | 20 |" in report
    assert "| sub/b.trace | - | job" in report
    assert "- 1 traces could not run on this cluster" in report


def test_a_folder_without_traces_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main([str(tmp_path)])


def test_zero_seeds_is_refused(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "gavel_small_test.trace", tmp_path / "a.trace")
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--seeds", "0", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_arrival_scale_replays_the_traces_at_a_higher_load(tmp_path: Path) -> None:
    """As `arbiter bench --arrival-scale`: 0.01 brings arrivals 100x closer, so jobs queue."""
    shutil.copy(FIXTURES / "gavel_msr_0e4a51_head.trace", tmp_path / "a.trace")
    jct = {}
    for scale in ("1", "0.01"):
        out = tmp_path / f"out-{scale}"
        argv = [str(tmp_path), "--out", str(out), "--workers", "1", "--cluster", "gavel:4:4:4"]
        main([*argv, "--policies", "fifo,arbiter", "--arrival-scale", scale])
        data = json.loads((out / "sweep.json").read_text())
        assert data["arrival_scale"] == float(scale)
        assert f"arrivals x{scale}" in (out / "sweep.md").read_text()
        jct[scale] = data["traces"][0]["policies"]["fifo"]["avg_jct_h"]
    assert jct["0.01"] > jct["1"]


@pytest.mark.parametrize("scale", ["0", "-1", "nan"])
def test_a_bad_arrival_scale_is_refused(tmp_path: Path, scale: str) -> None:
    shutil.copy(FIXTURES / "gavel_small_test.trace", tmp_path / "a.trace")
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--arrival-scale", scale, "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_tier_choices_reach_every_replay_and_the_table_says_so(tmp_path: Path) -> None:
    """Every job at tier 3 (`--tier-mix 0,0,1` where the trace has no tiers): no tier-1 job,
    so tier 1's mean JCT is 0 (with the default mix, 50 jobs include tier-1 jobs)."""
    shutil.copy(FIXTURES / "gavel_msr_0e4a51_head.trace", tmp_path / "a.trace")
    out = tmp_path / "out"
    main([str(tmp_path), "--out", str(out), "--workers", "1", "--cluster", "gavel:4:4:4",
          "--policies", "fifo,arbiter", "--tier-mix", "0,0,1"])  # fmt: skip
    data = json.loads((out / "sweep.json").read_text())
    assert data["reading"].startswith("tiers by the format's tier field, else drawn 0% / 0% / 100%")
    assert "drawn 0% / 0% / 100%" in (out / "sweep.md").read_text()
    for kpis in data["traces"][0]["policies"].values():
        assert kpis["tier1_mean_jct_h"] == 0


def test_a_bad_tier_mix_is_refused_before_anything_runs(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "gavel_small_test.trace", tmp_path / "a.trace")
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--tier-mix", "1,1,1", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
