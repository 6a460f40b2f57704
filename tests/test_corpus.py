"""`python -m bench.corpus`: the corpus evaluation's aggregation, goals, record and cache."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest

from bench import corpus
from bench.corpus import (
    Entry,
    Row,
    build_yarn,
    file_digest,
    main,
    ratio,
    ratio_text,
    summarise,
    trace_digest,
)

FIXTURES = Path(__file__).parent / "fixtures" / "traces"


def _row(trace: str, **policies: tuple[float, float, float]) -> Row:
    keys = ("avg_jct_h", "tier1_p99_queue_min", "tier1_mean_jct_h")
    return Row(trace, 10, None, {p: dict(zip(keys, v, strict=True)) for p, v in policies.items()})


def test_ratios_tie_at_one_and_a_zero_baseline_is_infinite() -> None:
    assert ratio(1.8, 2.0) == pytest.approx(0.9)
    assert ratio(0.0, 0.0) == 1.0
    assert ratio(2.0 * (1 + 1e-9), 2.0) == 1.0
    assert ratio(5.0, 0.0) == math.inf


def test_a_printed_ratio_reads_1_only_for_a_tie() -> None:
    # 5.8800 against 5.8812 is a win (no tie: they differ by more than a millionth).
    assert ratio_text(ratio(5.8800, 5.8812)) == "0.9998"
    assert ratio_text(ratio(7.371, 7.367)) == "1.001"
    assert ratio_text(ratio(2.0 * (1 + 3e-6), 2.0)) == "1.000003"
    assert ratio_text(ratio(2.0 * (1 + 1e-9), 2.0)) == "1.000"  # a tie
    assert ratio_text(ratio(1.8, 2.0)) == "0.900"
    assert ratio_text(ratio(5.0, 0.0)) == "inf"


def test_mechanics_goals_against_hand_computed_values() -> None:
    rows = [
        _row("a", fifo=(2.0, 0, 0), gavel=(2.5, 0, 0), arbiter=(1.8, 0, 0)),  # 0.9, WIN
        _row("b", fifo=(1.0, 0, 0), arbiter=(1.0, 0, 0)),  # 1.0, TIE
        Row("c", error="job x needs 64 GPUs"),  # does not count
    ]
    v = summarise("mechanics", rows)
    assert v.judged == 2
    assert v.tally == {"avg_jct_h": {"WIN": 1, "TIE": 1, "LOSS": 0}}
    assert v.geomean == pytest.approx(math.sqrt(0.9))  # 0.949
    assert v.worst == (1.0, "b")
    assert [ok for _, ok in v.goals] == [True, True]

    rows[1] = _row("b", fifo=(1.0, 0, 0), arbiter=(1.1, 0, 0))  # 1.1, LOSS
    v = summarise("mechanics", rows)
    assert v.tally["avg_jct_h"] == {"WIN": 1, "TIE": 0, "LOSS": 1}
    assert v.geomean == pytest.approx(math.sqrt(0.99))  # 0.995 > 0.97
    assert v.worst == (pytest.approx(1.1), "b")
    assert [ok for _, ok in v.goals] == [False, False]


def test_tiers_goals_against_hand_computed_values() -> None:
    rows = [
        # mean JCT 1.02; tier-1 P99 ties at 0; tier-1 mean JCT wins (best baseline: gavel)
        _row("a", fifo=(1.0, 0.0, 3.0), gavel=(1.2, 4.0, 2.0), arbiter=(1.02, 0.0, 1.5)),
        # mean JCT 1.03; tier-1 P99 loses (5 min against 0)
        _row("b", fifo=(2.0, 0.0, 1.0), arbiter=(2.06, 5.0, 1.0)),
    ]
    v = summarise("tiers", rows)
    assert v.tally == {
        "avg_jct_h": {"WIN": 0, "TIE": 0, "LOSS": 2},
        "tier1_p99_queue_min": {"WIN": 0, "TIE": 1, "LOSS": 1},
        "tier1_mean_jct_h": {"WIN": 1, "TIE": 1, "LOSS": 0},
    }
    assert v.geomean == pytest.approx(math.sqrt(1.02 * 1.03))
    (share_goal, share_ok), (geo_goal, geo_ok) = v.goals
    assert "1 of 2, 50%" in share_goal and not share_ok  # 50 % < 90 %
    assert geo_ok  # 1.025 <= 1.05
    rows[1] = _row("b", fifo=(2.0, 0.0, 1.0), arbiter=(2.06, 0.0, 1.0))
    assert summarise("tiers", rows).goals[0][1]  # 2 of 2


def test_no_judged_trace_fails_every_goal() -> None:
    for setting in ("mechanics", "tiers"):
        assert not any(ok for _, ok in summarise(setting, [Row("c", error="x")]).goals)


def test_a_yarn_trace_is_built_from_the_samples_seeded(tmp_path: Path) -> None:
    samples = tmp_path / "yarn-gput9.csv"
    samples.write_text("duration\n" + "\n".join(str(d) for d in (120, 480, 960, 4000)) + "\n")
    jobs = tmp_path / "60_job.csv"
    jobs.write_text("job_id,num_gpu,submit_time,duration\n0,1,0,5\n1,4,3,5\n")
    spec = FIXTURES / "n32g4.csv"
    first = build_yarn(samples, jobs, spec, tmp_path / "a").read_text()
    assert build_yarn(samples, jobs, spec, tmp_path / "b").read_text() == first
    rows = list(csv.DictReader(first.splitlines()))
    assert len(rows) == 4
    assert {int(r["num_gpu"]) for r in rows} <= {1, 4}
    # every sample once, as GPU time = GPUs x run time (to the rounding of a second)
    gpu_time = sorted(int(r["num_gpu"]) * int(r["duration"]) for r in rows)
    assert gpu_time == pytest.approx([120, 480, 960, 4000], abs=2)
    submits = [int(r["submit_time"]) for r in rows]
    assert submits[0] == 0 and submits == sorted(submits)


def test_a_pod_list_without_times_is_cached_by_the_default_list_it_reads_too(
    tmp_path: Path,
) -> None:
    for name in ("openb_pod_list_default.csv", "openb_pod_list_multigpu20.csv"):
        shutil.copy(FIXTURES / "openb_multigpu" / name, tmp_path / name)
    sampled = Entry(
        "alibaba/multigpu20", tmp_path / "openb_pod_list_multigpu20.csv", "alibaba-v2023", "x"
    )
    default = Entry(
        "alibaba/default", tmp_path / "openb_pod_list_default.csv", "alibaba-v2023", "x"
    )
    assert trace_digest(default) == file_digest(default.path)  # its own times
    before = trace_digest(sampled)
    assert before != file_digest(sampled.path)
    with default.path.open("a") as f:
        f.write("openb-pod-9999,8000,30517,1,1000,,BE,Succeeded,5,50,5\n")
    assert trace_digest(sampled) != before


def _corpus_root(tmp_path: Path) -> Path:
    """Two tiny traces in the shared folder's layout: a Tiresias job file on one cluster file
    and a Gavel trace."""
    root = tmp_path / "traces"
    (root / "tiresias").mkdir(parents=True)
    (root / "gavel" / "traces" / "physical_cluster").mkdir(parents=True)
    lines = (FIXTURES / "60_job.csv").read_text().splitlines()[:13]
    (root / "tiresias" / "60_job.csv").write_text("\n".join(lines) + "\n")
    shutil.copy(FIXTURES / "n32g4.csv", root / "tiresias" / "n32g4.csv")
    shutil.copy(
        FIXTURES / "gavel_small_test.trace",
        root / "gavel" / "traces" / "physical_cluster" / "small.trace",
    )
    return root


def _args(tmp_path: Path, root: Path) -> list[str]:
    return [
        "--root",
        str(root),
        "--policies",
        "fifo,arbiter",
        "--seeds",
        "0",
        "--jobs",
        "1",
        "--results",
        str(tmp_path / "results"),
        "--doc",
        str(tmp_path / "doc" / "corpus.md"),
    ]


def _cached(tmp_path: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in (tmp_path / "results").rglob("*.json")}


def test_the_tool_writes_the_record_and_resumes_from_its_cache(tmp_path: Path) -> None:
    root = _corpus_root(tmp_path)
    assert main(_args(tmp_path, root)) == 0
    doc = (tmp_path / "doc" / "corpus.md").read_text()
    assert (tmp_path / "doc" / "corpus.png").stat().st_size > 0
    assert "**Partial run.** It covers 2 of the corpus's 2 traces" in doc
    assert "[gavel-crosscheck.md](gavel-crosscheck.md)" in doc

    cached = _cached(tmp_path)
    assert len(cached) == 2 * 2 * 2  # traces x settings x policies, one seed
    runs = [json.loads(p.read_text()) for p in cached]
    assert all("kpis" in r and r["cpu_s"] >= 0 for r in runs)
    named = {(r["task"]["trace"], r["task"]["setting"], r["task"]["policy"]) for r in runs}
    assert len(named) == 8 and {r["task"]["seed"] for r in runs} == {0}

    # The table's ratios are the cached runs' Arbiter over fifo, trace by trace.
    results, cost = doc.split("## What the run cost")
    for line in results.splitlines():
        if not line.startswith("| gavel/") and not line.startswith("| tiresias/"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        ours, best = (float(x) for x in cells[3].replace(" h", "").split(" vs fifo "))
        assert cells[2].split()[0] == ratio_text(ratio(ours, best))
    tables = [line for line in doc.splitlines() if line.startswith("| trace |")]
    assert tables[0].count("|") == 5 and tables[1].count("|") == 9  # mechanics, tiers
    assert doc.count("PASS: ") + doc.count("FAIL: ") == 4
    families = [line.split("|")[1].strip() for line in cost.splitlines() if line.startswith("| ")]
    assert sorted(families[1:]) == ["gavel/physical_cluster", "tiresias/60_job"]

    # A second run measures nothing again; a lost result is measured again, alone.
    assert main(_args(tmp_path, root)) == 0
    assert _cached(tmp_path) == cached
    lost = next(iter(cached))
    lost.unlink()
    assert main(_args(tmp_path, root)) == 0
    again = _cached(tmp_path)
    assert set(again) == set(cached)
    assert {p for p in again if again[p] != cached[p]} == {lost}
    assert _results_part((tmp_path / "doc" / "corpus.md").read_text()) == _results_part(doc)


def _results_part(doc: str) -> list[str]:
    """The record less its date line and what the run cost."""
    results = doc.split("## What the run cost")[0]
    return [x for x in results.splitlines() if not x.startswith("Generated")]


def test_a_subset_by_glob_and_bad_options_are_refused(tmp_path: Path) -> None:
    root = _corpus_root(tmp_path)
    assert main([*_args(tmp_path, root), "--traces", "gavel/*", "--settings", "mechanics"]) == 0
    assert len(_cached(tmp_path)) == 2
    for bad in (["--traces", "nothing*"], ["--seeds", "a"], ["--policies", "fifo,gavel"]):
        with pytest.raises(SystemExit):
            main([*_args(tmp_path, root), *bad])


def test_baselines_come_from_an_earlier_commit_only_where_they_decide_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _corpus_root(tmp_path)
    args = [*_args(tmp_path, root), "--traces", "gavel/*", "--settings", "mechanics"]
    assert main(args) == 0
    here = {json.loads(p.read_text())["task"]["policy"]: p for p in _cached(tmp_path)}
    # The same run cached at an "earlier" commit, with a mean JCT this code would not give.
    earlier = tmp_path / "results" / "earlier"
    earlier.mkdir()
    run = json.loads(here["fifo"].read_text())
    run["kpis"]["avg_jct_h"] = 18.0
    (earlier / here["fifo"].name).write_text(json.dumps(run))
    here["fifo"].unlink()
    here["arbiter"].unlink()
    code = corpus.committed_code
    # HEAD~0 names this very commit: it stands for an earlier one whose cache is "earlier".
    monkeypatch.setattr(
        corpus, "committed_code", lambda rev="HEAD": "earlier" if rev == "HEAD~0" else code(rev)
    )
    assert main([*args, "--baselines-from", "HEAD~0"]) == 0
    doc = (tmp_path / "doc" / "corpus.md").read_text()
    assert "1 of the 1 baseline runs were read from the caches of commits `HEAD~0`" in doc
    assert "vs fifo 18.000 h" in doc
    assert here["arbiter"].is_file() and not here["fifo"].is_file()  # only Arbiter ran again

    # Refused where a baseline's decisions differ from the earlier commit's.
    digests = json.loads(corpus.DIGESTS.read_text())
    key = next(k for k in digests if k.endswith("/fifo"))
    digests[key] = {**digests[key], "sha256": "0" * 64}
    changed = tmp_path / "digests.json"
    changed.write_text(json.dumps(digests))
    monkeypatch.setattr(corpus, "DIGESTS", changed)
    assert corpus.changed_baselines("HEAD~0") == [key]
    with pytest.raises(SystemExit):
        main([*args, "--baselines-from", "HEAD~0"])
    with pytest.raises(SystemExit):
        main([*args, "--baselines-from", "no-such-commit"])
