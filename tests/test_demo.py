"""`make demo` stopped by a signal other than Ctrl-C (a closed terminal, a supervisor's stop)
stops its server and agent too, instead of leaving them holding the port, and a second signal
while it stops does not cut its stop short."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_arbiter.control.launch import free_port


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _processes_naming(*texts: str) -> list[int]:
    """The processes whose command line holds any of `texts` (the demo and its server name its
    work folder, the agent the server's URL)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if any(t in cmdline for t in texts) and int(entry.name) != os.getpid():
                pids.append(int(entry.name))
    return pids


@pytest.mark.parametrize(
    "sigs",
    [
        (signal.SIGTERM,),
        (signal.SIGHUP,),
        # Ctrl-C, then a second signal while it stops (make passes one on, or Ctrl-C twice).
        (signal.SIGINT, signal.SIGTERM),
    ],
)
def test_a_demo_ended_by_a_signal_takes_its_server_and_agent_with_it(tmp_path, sigs):
    port = free_port()
    workdir = tmp_path / "demo"
    ours = (str(workdir), f"127.0.0.1:{port}")
    demo = subprocess.Popen(
        [sys.executable, "-m", "gpu_arbiter.demo", "--workdir", str(workdir), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (_listening(port) and len(_processes_naming(*ours)) >= 3):
            assert demo.poll() is None and time.monotonic() < deadline, "the demo did not start"
            time.sleep(0.2)
        for sig in sigs:
            demo.send_signal(sig)
            time.sleep(0.1)
        _, err = demo.communicate(timeout=60)
        assert demo.returncode == 0 and "Traceback" not in err, err
        deadline = time.monotonic() + 30
        while _processes_naming(*ours) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_naming(*ours) == []
        assert not _listening(port)
    finally:
        if demo.poll() is None:
            demo.kill()
        for pid in _processes_naming(*ours):
            os.kill(pid, signal.SIGKILL)
