"""The checkpoint SDK on its own: atomic saves, keep-last-K, resume, SIGTERM, telemetry."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from gpu_arbiter.examples.train_tiny import train
from gpu_arbiter.sdk import PREEMPTED_EXIT_CODE, Run
from tests.failover import dead_then_live


def test_a_resumed_run_ends_exactly_where_an_uninterrupted_one_does(tmp_path):
    straight = train(60, checkpoint_dir=str(tmp_path / "a"), backend="numpy")
    train(25, checkpoint_dir=str(tmp_path / "b"), every_s=1e9, backend="numpy")
    resumed = train(60, checkpoint_dir=str(tmp_path / "b"), backend="numpy")
    assert resumed["resumed_from"] == 24
    assert resumed["w"] == straight["w"]


def test_only_the_last_k_checkpoints_are_kept(tmp_path):
    run = Run(tmp_path, keep=2, handle_sigterm=False)
    for step in range(5):
        run.save(step, {"step": step})
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-0000000003.pkl",
        "ckpt-0000000004.pkl",
    ]


def test_resume_skips_a_checkpoint_that_does_not_read_back(tmp_path):
    run = Run(tmp_path, handle_sigterm=False)
    run.save(7, {"step": 7})
    (tmp_path / "ckpt-0000000009.pkl").write_bytes(b"not a pickle")
    again = Run(tmp_path, handle_sigterm=False)
    assert again.resume() == {"step": 7} and again.start_step == 8


def test_without_a_checkpoint_resume_gives_the_default(tmp_path):
    run = Run(tmp_path, handle_sigterm=False)
    assert run.resume(default="fresh") == "fresh" and run.start_step == 0


def test_sigterm_saves_the_current_state_and_exits_143(tmp_path):
    script = (
        "import time\n"
        "from gpu_arbiter.sdk import Run\n"
        f"run = Run({str(tmp_path)!r}, every_s=1e9)\n"
        "print('ready', flush=True)\n"
        "for step in range(100000):\n"
        "    time.sleep(0.01)\n"
        "    run.step(step, {'step': step})\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == PREEMPTED_EXIT_CODE
    run = Run(tmp_path, handle_sigterm=False)
    state = run.resume()
    assert state["step"] == run.start_step - 1 >= 1


def test_telemetry_is_posted_with_the_job_token(tmp_path, monkeypatch):
    got: list[tuple[str, str, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            got.append((self.path, self.headers["Authorization"], body))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("ARBITER_URL", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("ARBITER_JOB_ID", "j7")
    monkeypatch.setenv("ARBITER_JOB_TOKEN", "job_secret")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("ARBITER_ALLOCATION", "n2:0,1;n3:0,1")
    monkeypatch.delenv("ARBITER_NODE", raising=False)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    try:
        run = Run(tmp_path, handle_sigterm=False)
        run.step(0, {}, loss=0.5)
        run.step(1, {}, loss=0.4)  # within report_every_s: not sent
        # A NaN or infinity is sent at once, as a string JSON can carry.
        run.step(2, {}, step_time_s=0.25, loss=float("nan"), grad_norm=float("-inf"))
        run.finish(2, {})
        deadline = time.monotonic() + 10
        while len(got) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.shutdown()
    assert {path for path, _, _ in got} == {"/v1/jobs/j7/telemetry"}
    assert {auth for _, auth, _ in got} == {"Bearer job_secret"}
    assert [b["event"] for _, _, b in got] == ["progress", "progress", "checkpoint", "finished"]
    assert got[0][2]["loss"] == 0.5
    broken = got[1][2]
    assert (broken["step"], broken["loss"], broken["grad_norm"]) == (2, "nan", "-inf")
    assert (broken["rank"], broken["node"], broken["step_time_s"]) == (3, "n2", 0.25)


def test_the_sdk_needs_neither_torch_nor_the_rest_of_arbiter():
    code = (
        "import sys, gpu_arbiter.sdk\n"
        "print(sorted(m for m in sys.modules if m.startswith(('gpu_arbiter', 'torch'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['gpu_arbiter', 'gpu_arbiter.sdk', 'gpu_arbiter.sdk.run']"


@pytest.mark.parametrize("bad", [{"every_s": 0}, {"keep": 0}])
def test_nonsense_settings_are_refused(tmp_path, bad):
    with pytest.raises(ValueError):
        Run(tmp_path, handle_sigterm=False, **bad)


def test_telemetry_moves_to_the_next_server_of_a_url_list_when_one_does_not_answer(
    tmp_path, monkeypatch
):
    """ARBITER_URL lists a leader and its standby: with the leader gone, reports reach the
    standby (issue 46 item 4)."""
    monkeypatch.setenv("ARBITER_JOB_ID", "j7")
    monkeypatch.setenv("ARBITER_JOB_TOKEN", "job_secret")
    with dead_then_live() as servers:
        monkeypatch.setenv("ARBITER_URL", servers.urls)
        run = Run(tmp_path, handle_sigterm=False)
        run.step(0, {}, loss=0.5)
        run.finish(0, {})
        deadline = time.monotonic() + 10
        while len(servers.got) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    got = [json.loads(body)["event"] for _, _, body in servers.got]
    assert got == ["progress", "checkpoint", "finished"]
