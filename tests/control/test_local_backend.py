"""The local backend: process groups, CUDA_VISIBLE_DEVICES, SIGTERM then SIGKILL after the
grace, one process per GPU at a time, and adoption by a new backend after a restart."""

from __future__ import annotations

import os
import subprocess
import time

from gpu_arbiter.backends.base import Placement, Running
from gpu_arbiter.backends.local import LocalBackend
from gpu_arbiter.control.reconcile import reconcile
from gpu_arbiter.domain import JobFinished, JobStopped
from gpu_arbiter.domain.events import JobFailed


def placement(job_id: str, command: str, gpus=(0, 1), node: str = "n1") -> Placement:
    return Placement(job_id, command, {node: tuple(gpus)}, "H100")


def events_until(backend: LocalBackend, n: int, timeout_s: float = 20.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got += backend.poll()
        time.sleep(0.05)
    return got


def test_a_job_sees_its_gpus_and_its_exit_code_is_reported(tmp_path):
    b = LocalBackend(tmp_path, allow_root=True)
    b.start(placement("ok", "echo $CUDA_VISIBLE_DEVICES", gpus=(2, 5)))
    b.start(placement("bad", "exit 7", gpus=(0,)))
    got = events_until(b, 2)
    assert {type(e) for e in got} == {JobFinished, JobFailed}
    assert next(e for e in got if isinstance(e, JobFailed)).exit_code == 7
    assert b.log_path("ok").read_text().strip() == "2,5"


def test_stop_sends_sigterm_then_sigkill_after_the_grace(tmp_path):
    b = LocalBackend(tmp_path, min_grace_s=0.5, allow_root=True)
    b.start(placement("stubborn", "trap '' TERM; sleep 60"))
    time.sleep(0.3)
    t0 = time.monotonic()
    b.stop("stubborn", 1.0)
    got = events_until(b, 1)
    assert [type(e) for e in got] == [JobStopped]
    assert 0.9 <= time.monotonic() - t0 < 10


def test_a_job_on_gpus_still_held_by_a_stopping_job_waits_for_it(tmp_path):
    b = LocalBackend(tmp_path, min_grace_s=5, allow_root=True)
    b.start(placement("old", "trap 'sleep 0.5; exit 0' TERM; sleep 60 & wait"))
    time.sleep(0.3)
    b.stop("old", 0.0)
    b.start(placement("new", "echo started", gpus=(1,)))
    assert [r.job_id for r in b.running()] == ["new"]  # queued, not launched
    got = events_until(b, 2)
    assert [type(e) for e in got] == [JobStopped, JobFinished]


def test_a_new_backend_adopts_running_jobs_and_reports_exits_it_missed(tmp_path):
    first = LocalBackend(tmp_path, allow_root=True)
    first.start(placement("long", "sleep 1.5"))
    first.start(placement("short", "exit 4", gpus=(4,)))
    time.sleep(0.5)
    first.shutdown()  # the control plane dies; its jobs do not
    second = LocalBackend(tmp_path, allow_root=True)
    assert {r.job_id for r in second.running()} == {"long", "short"}
    got = events_until(second, 2)
    assert {(type(e), e.job_id) for e in got} == {(JobFinished, "long"), (JobFailed, "short")}
    assert next(e for e in got if e.job_id == "short").exit_code == 4


def test_a_job_that_exited_before_its_launch_returned_is_reported_after_a_restart(
    tmp_path, monkeypatch
):
    """A command as short as `true` can be a zombie before the backend reads its start time;
    recorded as unknown (0), a new backend took the long-gone process for a live one and never
    reported its end, so the job held its GPU until its node was given up on."""

    class ExitsFirst(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped

    monkeypatch.setattr("gpu_arbiter.backends.local.subprocess.Popen", ExitsFirst)
    first = LocalBackend(tmp_path, allow_root=True)
    first.start(placement("quick", "true", gpus=(5,)))
    first.shutdown()  # the control plane dies before it sees the exit
    second = LocalBackend(tmp_path, allow_root=True)
    assert [r.job_id for r in second.running()] == ["quick"]
    got = events_until(second, 1)
    assert [(type(e), e.job_id) for e in got] == [(JobFinished, "quick")]
    assert second.running() == []


def test_reconcile_adopts_requeues_and_stops_orphans():
    plan = reconcile(["a", "b"], [Running("a", ("n1",)), Running("x", ("n1",))])
    assert (plan.adopt, plan.lost, plan.orphans) == (("a",), ("b",), ("x",))


def test_the_grafana_dashboard_only_uses_metrics_the_server_exports():
    import json
    import re
    from importlib.resources import files

    from gpu_arbiter.control.metrics import Metrics

    dash = json.loads(files("gpu_arbiter.examples").joinpath("grafana-dashboard.json").read_text())
    families = set(re.findall(r"# TYPE (\S+)", Metrics().exposition().decode()))
    for panel in dash["panels"]:
        for target in panel["targets"]:
            for name in re.findall(r"arbiter_[a-z_]+", target["expr"]):
                assert {name, re.sub(r"_(bucket|sum|count)$", "", name)} & families, name


def test_a_job_ignoring_its_notice_is_killed_at_its_deadline(tmp_path):
    b = LocalBackend(tmp_path / "jobs", min_grace_s=0.5, allow_root=True)
    beat = tmp_path / "beat"  # the job's last sign of life
    # Written aside and renamed, so a kill mid-write never leaves the file empty.
    tick = f"date +%s.%N > {beat}.tmp; mv {beat}.tmp {beat}"
    b.start(placement("deaf", f"trap '' TERM; while :; do {tick}; sleep 0.1; done"))
    while not beat.exists():
        time.sleep(0.05)
    noticed = time.time()
    b.stop("deaf", 2.0)
    assert [type(e) for e in events_until(b, 1)] == [JobStopped]
    last = float(beat.read_text())
    assert noticed + 2.0 - 1.0 <= last <= noticed + 2.0 + 2.0, last - noticed
