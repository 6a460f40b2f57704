"""The cluster's own history (`--format arbiter`): what a replay runs, and bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_arbiter.domain import InvalidInput
from gpu_arbiter.traces.arbiter_history import (
    history_cluster,
    history_teams,
    real_queueing,
)
from gpu_arbiter.traces.base import TraceOptions
from gpu_arbiter.traces.registry import read_trace

T0 = 1764000000.0


@pytest.fixture
def history(traces_dir: Path) -> Path:
    return traces_dir / "arbiter_history.jsonl"


def test_a_job_runs_for_the_work_it_kept_at_the_type_it_ran_on(history: Path) -> None:
    specs, stats = read_trace(history, "arbiter")
    jobs = {j.id: j for j in specs}
    assert sorted(jobs) == ["j-1", "j-2", "j-3"]
    assert dict(stats.skipped) == {"never_ran": 1, "unfinished": 1}
    one, two, three = jobs["j-1"], jobs["j-2"], jobs["j-3"]
    assert one.duration_s == pytest.approx(3600.0)
    assert (one.team, int(one.tier), one.gpus, one.walltime_s) == ("ads", 2, 8, 7200.0)
    assert one.submit_s == 0.0 and two.submit_s == 60.0
    # 3600 s on H100, then 5360 s on A100 at 0.87 of an H100.
    assert two.duration_s == pytest.approx(3600.0 + 5360.0 * 0.87)
    assert two.checkpoint_interval_s == 1800.0 and dict(two.gpu_types) == {
        "H100": 1.0,
        "A100": 0.87,
    }
    # 600 s of which a failure lost 300, then 500 s: it ran (and failed) for 800 s of work.
    assert three.duration_s == pytest.approx(800.0)
    assert int(three.tier) == 3


def test_the_cluster_teams_and_real_queueing_come_from_the_file(history: Path) -> None:
    cluster = history_cluster(history)
    assert cluster.gpus_by_type() == {"H100": 16, "A100": 8}
    teams = {t.name: t for t in history_teams(history, cluster)}
    assert teams["llm"].weight == 2.0 and teams["llm"].budget_per_period == 5000.0
    assert dict(teams["ads"].quota) == {"H100": 8}
    waits = {w.id: w.queue_delay_s for w in real_queueing(history, TraceOptions())}
    assert waits == {"j-1": 5.0, "j-2": 0.0, "j-3": 80.0}


def _write(tmp_path: Path, header: object, *jobs: str) -> Path:
    path = tmp_path / "h.jsonl"
    first = header if isinstance(header, str) else json.dumps(header)
    path.write_text("\n".join([first, *jobs]) + "\n")
    return path


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("not json", "line 1: not a JSON header"),
        ({"format": "slurm-sacct", "version": 1}, "not an arbiter-history file"),
        ({"format": "arbiter-history", "version": 9}, "version 9 is not one this reader knows"),
        ({"format": "arbiter-history", "version": 1, "teams": []}, "header has no 'cluster'"),
    ],
)
def test_a_file_that_is_not_a_history_is_refused_in_one_line(
    tmp_path: Path, header: object, message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        read_trace(_write(tmp_path, header), "arbiter")


def test_bad_job_lines_are_counted_or_refused_with_their_line(history: Path, tmp_path: Path):
    header, good, *_ = history.read_text().splitlines()
    broken = json.loads(good)
    broken["segments"][0]["end"] = "soon"
    path = _write(tmp_path, header, good, "{nope", json.dumps(broken))
    specs, stats = read_trace(path, "arbiter")
    assert len(list(specs)) == 1
    assert stats.bad_rows == {"json": [3], "segments[0]": [4]}
    with pytest.raises(InvalidInput, match="row 3: json"):
        list(read_trace(path, "arbiter", TraceOptions(strict=True))[0])
