"""Simulation reports on the dashboard, rendered from hand-written results.json files."""

from __future__ import annotations

import json
from pathlib import Path

from gpu_arbiter.web.reports import report_html


def kpis(jct: float, util: float) -> dict:
    return {"jobs": 60, "avg_jct_s": jct, "utilization": util}


def write(folder: Path, doc: dict) -> Path:
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(doc))
    return folder


def test_a_report_under_several_seeds_shows_every_seed_and_the_spread(tmp_path):
    by_seed = {
        "4": {"fifo": kpis(100.0, 0.5), "arbiter": kpis(80.0, 0.6)},
        "5": {"fifo": kpis(90.0, 0.5), "arbiter": kpis(95.0, 0.7)},
    }
    spread = {
        "fifo": {"mean JCT": {"mean": 95.0, "min": 90.0, "max": 100.0}},
        "arbiter": {"mean JCT": {"mean": 87.5, "min": 80.0, "max": 95.0}},
    }
    doc = {"workload": "synthetic:60", "seed": 4, "policies": by_seed["4"]}
    folder = write(tmp_path / "r", {**doc, "by_seed": by_seed, "across_seeds": spread})
    html = report_html("r", folder)
    assert "seeds 4, 5" in html
    assert "<h2>Seed 4</h2>" in html and "<h2>Seed 5</h2>" in html
    assert "data-seed='5'" in html and "95 s" in html  # seed 5's own arbiter JCT
    assert "<td class='num best'>88 s (80 s – 95 s)</td>" in html  # best mean marked


def test_a_single_seed_report_has_one_table(tmp_path):
    doc = {"workload": "synthetic:60", "seed": 4, "policies": {"fifo": kpis(100.0, 0.5)}}
    html = report_html("r", write(tmp_path / "r", doc))
    assert html.count("<table") == 1 and "seed 4" in html and "Seed" not in html


def test_a_whatif_report_is_listed_beside_bench_reports_with_a_column_per_change(tmp_path):
    from gpu_arbiter.cli.whatif import whatif
    from gpu_arbiter.web.reports import find_reports, index_html

    history = Path(__file__).resolve().parents[1] / "fixtures/traces/arbiter_history.jsonl"
    whatif(history=history, out=tmp_path / "capacity", policy="fifo")
    write(tmp_path / "bench", {"workload": "synthetic:60", "policies": {"fifo": kpis(1.0, 0.5)}})
    found = find_reports(tmp_path)
    assert set(found) == {"bench", "capacity"}
    index = index_html(found, tmp_path)
    assert "what if: as it was, what if: policy fifo" in index
    html = report_html("capacity", found["capacity"])
    assert "<th>as it was</th><th>policy fifo</th>" in html
    assert "spend, team ads" in html and "queueing_by_team.png" in html
