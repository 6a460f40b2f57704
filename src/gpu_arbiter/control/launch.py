"""Start `arbiter serve` (and `arbiter agent`) as child processes on a free loopback port.

Used by the demo, the API benchmark and the tests, which must drive the real server — its own
process, its own database — and be able to `kill -9` it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from gpu_arbiter.backends.local import kill_leftovers
from gpu_arbiter.domain import ArbiterError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """One `arbiter serve` child. `start` returns once /healthz answers."""

    def __init__(
        self,
        db: str,
        state_dir: Path,
        admin_token: str,
        port: int | None = None,
        extra: Sequence[str] = (),
        log_path: Path | None = None,
    ) -> None:
        self.db = db
        self.state_dir = Path(state_dir)
        self.admin_token = admin_token
        self.port = port or free_port()
        self.extra = list(extra)
        self.log_path = log_path or self.state_dir / "server.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 120.0, ready: bool = True) -> ServerProcess:
        """Start the server; with `ready`, return once it answers (a standby does not answer
        before it takes over)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "gpu_arbiter.cli", "serve", "--db", self.db]
        cmd += ["--port", str(self.port), "--state-dir", str(self.state_dir)]
        cmd += ["--admin-token", self.admin_token, *self.extra]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        if ready:
            wait_ready(self.url, timeout_s, self.proc)
        return self

    def kill(self) -> None:
        """kill -9: the crash the control plane must survive."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ctrl-C: a clean shutdown."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop for good and leave no process behind: drain (every job stopped with no more
        notice than the server's least grace) and wait for the server to exit; then stop or
        kill whatever is left, jobs of a server killed earlier included."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                with self.client() as admin:
                    admin.post("/v1/drain", json={"grace_s": 0}).raise_for_status()
                self.proc.wait(timeout=timeout_s)
            except (httpx.HTTPError, subprocess.TimeoutExpired):
                pass
        self.stop()
        self.kill()
        kill_leftovers(self.state_dir / "jobs")

    def client(self, token: str | None = None, timeout_s: float = 30.0) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token or self.admin_token}"},
            timeout=timeout_s,
        )

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def wait_ready(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ArbiterError(f"the server exited with code {proc.returncode} before it was up")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise ArbiterError(f"the server at {url} did not answer within {timeout_s:g} s")


def start_agent(
    url: str,
    token: str,
    name: str,
    fake_gpus: int,
    gpu_type: str,
    rack: str = "rack0",
    interval_s: float = 2.0,
    log_path: Path | None = None,
) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "gpu_arbiter.cli", "agent", "--url", url, "--name", name]
    cmd += ["--fake-gpus", str(fake_gpus), "--gpu-type", gpu_type, "--rack", rack]
    cmd += ["--interval", str(interval_s)]
    env = {**os.environ, "ARBITER_TOKEN": token}
    out = log_path.open("ab") if log_path else subprocess.DEVNULL
    try:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    finally:
        if log_path:
            out.close()
