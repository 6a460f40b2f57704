"""The comparison directory `write_bench` lays out, from real runs of a small workload."""

import csv
import json

import pytest

from gpu_arbiter.domain.presets import small
from gpu_arbiter.engine.policies import POLICIES
from gpu_arbiter.sim import simulate
from gpu_arbiter.sim.plots import PLOTS
from gpu_arbiter.sim.report import (
    KPIS,
    RECORD_FIELDS,
    BenchSource,
    across_seeds,
    best_policies,
    report_markdown,
    results_json,
    write_bench,
)
from gpu_arbiter.traces.synthetic import synthetic_teams, synthetic_workload

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def results():
    topo = small()
    jobs = synthetic_workload(60, 3, topo, load=0.9)
    teams = synthetic_teams(topo)
    return {name: simulate(topo, teams, name, jobs) for name in POLICIES}


@pytest.fixture
def source():
    return BenchSource(workload="synthetic:60", fmt=None, stats=None, seed=3)


def test_bench_directory_has_results_report_plots_and_records_for_every_policy(
    tmp_path, results, source
):
    written = write_bench(tmp_path / "out", source, results)
    out = tmp_path / "out"
    expected = {out / "results.json", out / "report.md"}
    expected |= {out / name / "records.csv" for name in POLICIES}
    expected |= {out / file for file in PLOTS}
    assert set(written) == expected
    for file in PLOTS:
        assert (out / file).read_bytes().startswith(PNG_MAGIC)
    data = json.loads((out / "results.json").read_text())
    assert list(data["policies"]) == list(POLICIES)


def test_results_json_holds_each_policys_simulate_kpis_unchanged(results, source):
    data = json.loads(json.dumps(results_json(source, results)))
    for name, r in results.items():
        assert data["policies"][name] == json.loads(json.dumps(r.kpis))
    assert data["trace"] is None
    assert data["cluster"] == {"name": "small", "gpus": 64}


def test_records_csv_has_one_row_per_job_with_jct_and_queue_delay(tmp_path, results, source):
    write_bench(tmp_path, source, results)
    with (tmp_path / "arbiter" / "records.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == RECORD_FIELDS
    assert len(rows) == 60
    for row in rows:
        if row["completed"] == "1":
            jct = float(row["finish_s"]) - float(row["submit_s"])
            assert float(row["jct_s"]) == pytest.approx(jct)
            assert float(row["queue_delay_s"]) >= 0


def test_report_has_a_row_per_kpi_a_column_per_policy_and_links_the_plots(results, source):
    text = report_markdown(source, results)
    header = next(line for line in text.splitlines() if line.startswith("| KPI"))
    assert header == "| KPI | " + " | ".join(POLICIES) + " | best |"
    for kpi in KPIS:
        assert f"| {kpi.label} |" in text
    for file in PLOTS:
        assert f"]({file})" in text


def test_report_shows_each_tiers_mean_jct_from_that_tiers_finished_jobs(results, source):
    text = report_markdown(source, results)
    by_label = {k.label: k for k in KPIS}
    for name, r in results.items():
        for tier in (1, 2, 3):
            jcts = [x.jct_s for x in r.records if x.tier == tier and x.completed]
            assert jcts, f"the workload should have finished tier-{tier} jobs under {name}"
            kpi = by_label[f"mean JCT, tier {tier}"]
            assert kpi.value(r.kpis) == pytest.approx(sum(jcts) / len(jcts))
    row = next(line for line in text.splitlines() if line.startswith("| mean JCT, tier 3 |"))
    kpi = by_label["mean JCT, tier 3"]
    assert row.split(" | ")[1 : 1 + len(results)] == [
        kpi.show(kpi.value(r.kpis)) for r in results.values()
    ]


def test_best_policy_lists_every_tie_and_respects_direction():
    kpis = {
        "a": {"avg_jct_s": 5.0, "goodput": 0.5},
        "b": {"avg_jct_s": 5.0, "goodput": 0.7},
        "c": {"avg_jct_s": 9.0, "goodput": 0.7},
    }
    by_label = {k.label: k for k in KPIS}
    assert best_policies(by_label["mean JCT"], kpis) == ["a", "b"]
    assert best_policies(by_label["goodput"], kpis) == ["b", "c"]


def test_several_seeds_add_each_kpis_mean_and_range_and_a_table_of_them(results, source):
    topo = small()
    jobs = synthetic_workload(60, 4, topo, load=0.9)
    teams = synthetic_teams(topo)
    other = {name: simulate(topo, teams, name, jobs) for name in ("fifo", "arbiter")}
    runs = {3: {name: results[name] for name in other}, 4: other}
    spread = across_seeds(runs)
    for name in other:
        for kpi in KPIS:
            values = [kpi.value(runs[s][name].kpis) for s in (3, 4)]
            got = spread[name][kpi.label]
            assert got == {"mean": sum(values) / 2, "min": min(values), "max": max(values)}
    data = json.loads(json.dumps(results_json(source, runs[3], runs)))
    assert list(data["by_seed"]) == ["3", "4"] and list(data["across_seeds"]) == ["fifo", "arbiter"]
    text = report_markdown(source, runs[3], runs)
    assert "seeds 3, 4" in text
    table = text.split("## Across seeds 3, 4: mean (min – max)")[1].split("## Seed 3")[0]
    jct = spread["arbiter"]["mean JCT"]
    row = next(line for line in table.splitlines() if line.startswith("| mean JCT |"))
    mean_kpi = next(k for k in KPIS if k.label == "mean JCT")
    assert f"{mean_kpi.show(jct['mean'])} ({mean_kpi.show(jct['min'])} –" in row
    fastest = min(other, key=lambda n: spread[n]["mean JCT"]["mean"])
    assert row.endswith(f"| {fastest} |")


def test_one_seed_keeps_results_json_and_report_as_they_were(results, source):
    assert "by_seed" not in results_json(source, results, {3: results})
    assert "Across seeds" not in report_markdown(source, results, {3: results})
