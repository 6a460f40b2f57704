"""`Run`: checkpoint/resume and telemetry for one training job.

Checkpoints are pickles named `ckpt-<step>.pkl` in the checkpoint directory (from
`ARBITER_CHECKPOINT_DIR`, which the control plane sets per job, else `./checkpoints`). A save
writes a temporary file in the same directory, fsyncs it, renames it over the final name and
fsyncs the directory, so a crash or SIGKILL at any moment leaves either the old or the new
checkpoint, never a torn one; only the last `keep` are kept. `resume` loads the newest one that
reads back, skipping any that do not.

SIGTERM is the control plane's preemption notice: the handler only sets a flag, and the next
`step` call saves the state it is given (a consistent one, between steps), reports it and exits
with code 143 (128 + SIGTERM), before the grace period runs out and SIGKILL follows.

Telemetry (F4) goes to `ARBITER_URL/v1/jobs/<ARBITER_JOB_ID>/telemetry` with the job token
from `ARBITER_JOB_TOKEN`, from a background thread, at most every `report_every_s`; a server
that cannot be reached never slows down or breaks training. `ARBITER_URL` may list several
servers, comma-separated (a leader and its standbys): a report that cannot connect goes to the
next one, and later reports to the one that took it. A NaN or infinite metric is sent as the
string "nan", "inf" or "-inf", at once whatever the interval: it is what the server's circuit
breakers (F5) are there to catch. Each report also carries this process's rank (`RANK`, as
torchrun sets it, or `SLURM_PROCID`), its node and its step time, so a node whose ranks hold a
multi-node job back is found (stragglers).
"""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
import queue
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

log = logging.getLogger("gpu_arbiter.sdk")

PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM
_PREFIX, _SUFFIX = "ckpt-", ".pkl"


class Run:
    def __init__(
        self,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        every_s: float = 60.0,
        keep: int = 3,
        report_every_s: float = 10.0,
        handle_sigterm: bool = True,
    ) -> None:
        if every_s <= 0 or report_every_s <= 0:
            raise ValueError("every_s and report_every_s must be > 0")
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.dir = Path(checkpoint_dir or os.environ.get("ARBITER_CHECKPOINT_DIR") or "checkpoints")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.every_s = every_s
        self.keep = keep
        self.report_every_s = report_every_s
        self.start_step = 0
        self.resumed_from: int | None = None
        self.preempt_requested = False
        self._last_save = time.monotonic()
        self._last_report = 0.0
        self._last_step: float | None = None
        self.rank = _rank()
        self.node = _node()
        self._reporter = _Reporter.from_env()
        if handle_sigterm:
            signal.signal(signal.SIGTERM, self._on_sigterm)

    # -- the two calls a training loop makes -----------------------------------------------

    def resume(self, default: Any = None) -> Any:
        """The state of the newest readable checkpoint (and `start_step` after it), or
        `default` when there is none."""
        for step, path in reversed(self._checkpoints()):
            try:
                with path.open("rb") as f:
                    state = pickle.load(f)
            except (OSError, pickle.UnpicklingError, EOFError) as e:
                log.warning("skipping unreadable checkpoint %s: %s", path, e)
                continue
            self.start_step = step + 1
            self.resumed_from = step
            self._report({"event": "resume", "step": step, "checkpoint_step": step}, force=True)
            return state
        return default

    def step(
        self, step: int, state: Any, step_time_s: float | None = None, **metrics: float
    ) -> None:
        """Call once per step with the state after it: saves every `every_s`, reports
        telemetry, and on a preemption notice saves and exits. `metrics` are numbers such as
        `loss` and `grad_norm` (NaN and infinities included). `step_time_s` is this rank's own
        time for the step, before it waits for the other ranks; without it, the time since the
        last call is reported."""
        now = time.monotonic()
        if step_time_s is None and self._last_step is not None:
            step_time_s = now - self._last_step
        self._last_step = now
        if self.preempt_requested:
            self.save(step, state)
            self._report({"event": "preempted", "step": step}, force=True)
            self._reporter.flush(timeout_s=2.0)
            sys.exit(PREEMPTED_EXIT_CODE)
        if time.monotonic() - self._last_save >= self.every_s:
            self.save(step, state)
        values = {k: float(v) for k, v in metrics.items()}
        report: dict[str, Any] = {"event": "progress", "step": step, **_encode(values)}
        if step_time_s is not None and step_time_s > 0:
            report.update(rank=self.rank, node=self.node, step_time_s=step_time_s)
        broken = not all(math.isfinite(v) for v in values.values())
        self._report(report, force=broken)

    # -- the rest --------------------------------------------------------------------------

    def save(self, step: int, state: Any) -> Path:
        """Write a checkpoint of `state` after `step` atomically and drop all but the last
        `keep`."""
        final = self.dir / f"{_PREFIX}{step:010d}{_SUFFIX}"
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.dir)
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(self.dir)
        for _, old in self._checkpoints()[: -self.keep]:
            old.unlink(missing_ok=True)
        self._last_save = time.monotonic()
        self._report(
            {
                "event": "checkpoint",
                "step": step,
                "checkpoint_step": step,
                "checkpoint_at": time.time(),
            },
            force=True,
        )
        return final

    def finish(self, step: int | None = None, state: Any = None) -> None:
        """The job is done: save a last checkpoint when given one, and report it."""
        if step is not None:
            self.save(step, state)
        self._report(
            {"event": "finished", **({"step": step} if step is not None else {})}, force=True
        )
        self._reporter.flush(timeout_s=2.0)

    def _checkpoints(self) -> list[tuple[int, Path]]:
        found = []
        for p in self.dir.glob(f"{_PREFIX}*{_SUFFIX}"):
            try:
                found.append((int(p.name[len(_PREFIX) : -len(_SUFFIX)]), p))
            except ValueError:
                continue
        return sorted(found)

    def _on_sigterm(self, _signum: int, _frame: Any) -> None:
        self.preempt_requested = True

    def _report(self, data: dict[str, Any], force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_report >= self.report_every_s:
            self._last_report = now
            self._reporter.send(data)


def _encode(metrics: dict[str, float]) -> dict[str, float | str]:
    """Metrics as the API takes them: JSON has no NaN or infinity, so those go as the strings
    "nan", "inf" and "-inf" (which is how Python writes them)."""
    return {k: v if math.isfinite(v) else str(v) for k, v in metrics.items()}


def _rank() -> int:
    env = os.environ
    for name in ("RANK", "SLURM_PROCID"):
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def _node() -> str:
    """The node this process runs on, as the control plane names it: Arbiter's name where
    the executor set one, Slurm's, else the first node of a local allocation, else the host."""
    env = os.environ
    for name in ("ARBITER_NODE", "SLURMD_NODENAME"):
        if env.get(name):
            return env[name]
    alloc = env.get("ARBITER_ALLOCATION", "")
    if alloc:
        return alloc.split(";")[0].split(":")[0]
    return socket.gethostname()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Reporter:
    """Sends telemetry from a daemon thread; without ARBITER_URL it sends nothing."""

    def __init__(self, url: str | None, job_id: str | None, token: str | None) -> None:
        urls = [u.strip().rstrip("/") for u in (url or "").split(",") if u.strip()]
        self.endpoints = [f"{u}/v1/jobs/{job_id}/telemetry" for u in urls] if job_id else []
        self.endpoint = self.endpoints[0] if self.endpoints else None
        self.token = token or ""
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=1000)
        self._warned = False
        if self.endpoint:
            threading.Thread(target=self._drain, name="arbiter-telemetry", daemon=True).start()

    @classmethod
    def from_env(cls) -> _Reporter:
        env = os.environ
        return cls(env.get("ARBITER_URL"), env.get("ARBITER_JOB_ID"), env.get("ARBITER_JOB_TOKEN"))

    def send(self, data: dict[str, Any]) -> None:
        if self.endpoint:
            try:
                self._queue.put_nowait(data)
            except queue.Full:
                pass  # a server that lags behind loses samples, never training time

    def flush(self, timeout_s: float) -> None:
        if not self.endpoint:
            return
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)

    def _drain(self) -> None:
        while True:
            data = self._queue.get()
            try:
                self._post(data)
            finally:
                self._queue.task_done()

    def _post(self, data: dict[str, Any]) -> None:
        error: Exception | None = None
        for endpoint in list(self.endpoints):
            req = urllib.request.Request(
                endpoint,
                data=json.dumps(data).encode(),
                headers={
                    "Content-Type": "application/json",
                    "Authorization": f"Bearer {self.token}",
                },
                method="POST",
            )
            try:
                with urllib.request.urlopen(req, timeout=5):
                    pass
            except urllib.error.HTTPError as e:
                error = e  # the server got it and refused: asking another changes nothing
                break
            except (urllib.error.URLError, OSError) as e:
                error = e  # no answer: the next server, if there is one
                continue
            self.endpoint = endpoint
            self.endpoints.remove(endpoint)
            self.endpoints.insert(0, endpoint)
            return
        if error is not None and not self._warned:
            log.warning("telemetry to %s failed (%s); training goes on", self.endpoint, error)
            self._warned = True
