"""`bench.corpus_cost`: the corpus run's estimates, order, ETA and cost table."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.corpus_cost import Eta, cost_by_family, estimate, family, prior_costs


def test_a_trace_family_drops_cluster_seed_folder_and_share() -> None:
    assert family("tiresias/yarn-gput10000@cluster_spec") == "tiresias/yarn-gput"
    assert family("tiresias/60_job@n32g4") == "tiresias/60_job"
    assert family("gavel/msr/seed=3/6214e9") == "gavel/msr"
    assert family("gavel/physical_cluster/small_test") == "gavel/physical_cluster"
    assert family("alibaba/gpushare40") == "alibaba/gpushare"
    assert family("alibaba/default") == "alibaba/default"


def _cache(folder: Path, name: str, result: dict, mtime: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(result))
    os.utime(path, (mtime, mtime))


def test_prior_costs_come_from_other_code_versions_newest_first(tmp_path: Path) -> None:
    current = tmp_path / "code-now"
    _cache(tmp_path / "code-old", "a.json", {"wall_s": 9.0}, 1000)  # before CPU time was kept
    _cache(tmp_path / "code-new", "a.json", {"cpu_s": 4.0, "wall_s": 7.0}, 2000)
    _cache(tmp_path / "code-old", "b.json", {"cpu_s": 2.0}, 1000)
    _cache(current, "c.json", {"cpu_s": 50.0}, 3000)  # this version's own runs are not priors
    (tmp_path / "code-old" / "broken.json").write_text("{")
    assert prior_costs(current) == {"a.json": 4.0, "b.json": 2.0}
    assert prior_costs(tmp_path / "nowhere" / "x") == {}


def test_a_run_never_measured_is_estimated_from_its_family_then_its_policy() -> None:
    priors = {"m1": 30.0, "t1": 1.0}
    todo = [
        ("gavel/msr/seed=0/a", "gavel", 100, "m1"),  # measured: 30 s
        ("gavel/msr/seed=1/b", "gavel", 200, "m2"),  # the family's 0.3 s a byte
        ("tiresias/60_job@x", "fifo", 10, "t1"),  # measured: 1 s
        ("alibaba/default", "fifo", 50, "a1"),  # no fifo run of its family: fifo's 0.1 s a byte
        ("alibaba/default", "arbiter", 50, "a2"),  # no arbiter run: every run's 31/110 s a byte
    ]
    assert estimate(todo, priors) == pytest.approx([30.0, 60.0, 1.0, 5.0, 50 * 31 / 110])
    assert estimate(todo[:2], {}) == [100.0, 200.0]  # nothing measured: sizes only order them


def test_the_eta_follows_the_estimated_work_done_not_the_run_count() -> None:
    now = [0.0]
    lines: list[str] = []
    eta = Eta([90.0, 6.0, 4.0], 2, lines.append, every_s=60.0, clock=lambda: now[0])
    assert lines == ["3 runs to do, estimated 2 CPU-minutes: about 1 min on 2 worker processes"]
    now[0] = 30.0
    eta.ended_one(6.0)  # within a minute of the last line: nothing said
    assert len(lines) == 1
    now[0] = 300.0
    eta.ended_one(90.0)  # 96 % of the work in 5 min: 12.5 s left
    assert lines[1].startswith("2/3 runs, 96% of the estimated work, 5 min; ETA ")
    assert lines[1].endswith("(about 0 min left)")
    now[0] = 310.0
    eta.ended_one(4.0)  # the last one always says so
    assert lines[2] == "3/3 runs, 100% of the estimated work, 5 min"
    quiet: list[str] = []
    Eta([1.0], 1, quiet.append, measured=False)
    assert quiet == ["1 runs to do, none measured before: the ETA follows as they end"]


def test_the_cost_table_sums_cpu_minutes_by_family_and_policy() -> None:
    runs = [
        ("gavel/msr/seed=0/a", "gavel", {"cpu_s": 600.0}),
        ("gavel/msr/seed=1/b", "arbiter", {"cpu_s": 120.0}),
        ("alibaba/cpu050", "gavel", {"wall_s": 60.0}),  # no CPU time kept: its wall time
        ("alibaba/cpu037", "arbiter", {"error": "x", "cpu_s": 0.0}),
    ]
    header, cells = cost_by_family(runs, ["gavel", "arbiter"])
    assert header == ["family", "traces", "gavel", "arbiter", "all", "share"]
    assert cells == [
        ["gavel/msr", "2", "10.0", "2.0", "12.0", "92%"],
        ["alibaba/cpu", "2", "1.0", "0.0", "1.0", "8%"],
    ]
