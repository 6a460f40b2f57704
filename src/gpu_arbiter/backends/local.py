"""Run jobs as local processes: one process group per job, `CUDA_VISIBLE_DEVICES` set to its GPUs.

Preemption sends SIGTERM to the whole group at once (the job's notice to save), then SIGKILL
when the grace has run out. Every job gets at least `min_grace_s` between the two, so a job
preempted "at once" (tier 3, grace 0) can still write a final checkpoint; while it does, a job
that is to start on any of the same GPUs waits, so a GPU is never handed to two processes.

The backend survives a restart of the control plane: each job has a small state file
(`<state_dir>/<job>.json`: pid, process start time, GPUs, stop deadline), and the job's shell
wrapper writes the exit code to `<job>.rc` even when nobody is its parent any more. A new
`LocalBackend` over the same directory adopts the processes still alive and reports the exits
that happened while it was away on its first `poll`, at the time the job really ended (the exit
code file's time). A job whose state file is gone too (its exit was seen by a control plane that
died before recording it) is answered by `outcome` from the same file.

A command that cannot start — exec refuses its environment (too large, a NUL byte) or its
program is not found — is reported as `JobLaunchFailed` with the error, never as a run.

Isolation: a job starts with a minimal environment (PATH, HOME, LANG, USER, the `ARBITER_*`
variables, CUDA_VISIBLE_DEVICES and its own `env`), never the server's, in its own working
directory `<jobs_root>/<job>` (mode 0700), outside the server's state, as its team's `run_as`
user (see `identity`); a job its team may not run (as root without permission, as a user that
does not exist) is reported as `JobLaunchFailed` with the reason. Its log stays in the server's
directory, written through a descriptor the server opened, so a job cannot swap it for a link
to the server's files.

Multi-node allocations run as one local process that sees the GPUs of its first node in
`CUDA_VISIBLE_DEVICES` and the whole allocation in `ARBITER_ALLOCATION` ("node:0,1;node2:0,1"),
for a launcher such as torchrun to fan out.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_arbiter.backends import program
from gpu_arbiter.backends.base import Placement, Running
from gpu_arbiter.backends.identity import JobRefused, JobUser, env_script, job_user
from gpu_arbiter.domain import Event, InvalidInput, JobFinished, JobStopped
from gpu_arbiter.domain.events import JobFailed, JobLaunchFailed

# The outer shell ignores nothing (its children get default signal dispositions); its trap only
# defers TERM until the job has exited, so it can still record the exit code.
_WRAPPER = 'trap : TERM INT; /bin/sh -c "$1"; rc=$?; echo $rc > "$2.tmp"; mv "$2.tmp" "$2"'
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(slots=True)
class _Proc:
    job_id: str
    pid: int
    start_ticks: int
    gpus: set[tuple[str, int]]
    nodes: tuple[str, ...]
    popen: subprocess.Popen | None = None
    stopping: bool = False
    kill_at: float | None = None
    killed: bool = False


@dataclass(slots=True)
class _Deferred:
    placement: Placement
    gpus: set[tuple[str, int]] = field(default_factory=set)


class LocalBackend:
    name = "local"

    def __init__(
        self,
        state_dir: str | Path,
        min_grace_s: float = 5.0,
        jobs_root: str | Path | None = None,
        allow_root: bool = False,
    ) -> None:
        """`state_dir` holds the logs and process state (the server's, mode 0700);
        `jobs_root` the jobs' working directories (default: `<state_dir>-work` beside it);
        `allow_root` lets team jobs run as root."""
        if min_grace_s < 0:
            raise InvalidInput(f"local backend: min_grace_s must be >= 0, got {min_grace_s}")
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.dir.chmod(0o700)
        root = Path(jobs_root) if jobs_root is not None else None
        self.jobs_root = root or self.dir.with_name(self.dir.name + "-work")
        self.allow_root = allow_root
        self.min_grace_s = min_grace_s
        self._procs: dict[str, _Proc] = {}
        self._deferred: dict[str, _Deferred] = {}
        self._events: list[Event] = []
        self._adopt()

    # -- the Backend interface -------------------------------------------------------------

    def start(self, placement: Placement) -> None:
        gpus = {(n, g) for n, gs in placement.gpus_by_node.items() for g in gs}
        if placement.job_id in self._procs or self._busy(gpus):
            self._deferred[placement.job_id] = _Deferred(placement, gpus)
            return
        self._launch(placement, gpus)

    def stop(self, job_id: str, grace_s: float) -> None:
        if self._deferred.pop(job_id, None) is not None and job_id not in self._procs:
            self._events.append(JobStopped(job_id, time.time()))
            return
        proc = self._procs.get(job_id)
        if proc is None or proc.stopping:
            return
        proc.stopping = True
        proc.kill_at = time.time() + max(grace_s, self.min_grace_s)
        self._save(proc)
        _signal_group(proc.pid, signal.SIGTERM)

    def resize(self, placement: Placement) -> None:
        """Local processes cannot change GPUs in place: stop (with the short grace) and start
        again on the new GPUs, which waits for the old process to exit."""
        self.stop(placement.job_id, 0.0)
        self.start(placement)

    def poll(self) -> list[Event]:
        now = time.time()
        for proc in list(self._procs.values()):
            if self._alive(proc):
                if proc.kill_at is not None and now >= proc.kill_at and not proc.killed:
                    _signal_group(proc.pid, signal.SIGKILL)
                    proc.killed = True
                continue
            self._exited(proc, now)
        for job_id, d in list(self._deferred.items()):
            if job_id not in self._procs and not self._busy(d.gpus):
                del self._deferred[job_id]
                self._launch(d.placement, d.gpus)
        events, self._events = self._events, []
        return events

    def running(self) -> list[Running]:
        out = [Running(p.job_id, p.nodes) for p in self._procs.values() if not p.stopping]
        out += [
            Running(j, tuple(d.placement.gpus_by_node))
            for j, d in self._deferred.items()
            if j not in self._procs
        ]
        return out

    def log_path(self, job_id: str) -> Path:
        return self.dir / f"{job_id}.log"

    def outcome(self, job_id: str, since: float, alive_at: float | None = None) -> Event | None:
        """How a job this backend no longer runs ended, from the exit code its wrapper wrote,
        at the time it wrote it (never before `alive_at`, when the server last knew the job
        running); None when there is no record of the run that began at `since` (an older
        run's file, or the job never started)."""
        path = self.dir / f"{job_id}.rc"
        try:
            ended = path.stat().st_mtime
        except OSError:
            return None
        rc = _read_rc(path)
        if rc is None or ended < since:
            return None
        if alive_at is not None:
            ended = min(max(ended, alive_at), time.time())
        return JobFinished(job_id, ended) if rc == 0 else JobFailed(job_id, ended, rc)

    def shutdown(self) -> None:
        """Forget the children without killing them: jobs outlive a control-plane restart."""
        self._procs.clear()
        self._deferred.clear()

    # -- internals -------------------------------------------------------------------------

    def _busy(self, gpus: set[tuple[str, int]]) -> bool:
        return any(p.gpus & gpus for p in self._procs.values())

    def _launch(self, placement: Placement, gpus: set[tuple[str, int]]) -> None:
        job_id = placement.job_id
        rc_path = self.dir / f"{job_id}.rc"
        rc_path.unlink(missing_ok=True)
        nodes = tuple(placement.gpus_by_node)
        first = placement.gpus_by_node[nodes[0]] if nodes else ()
        try:
            user = job_user(placement.run_as, placement.team, self.allow_root)
            workdir = self._workdir(job_id, user)
        except (JobRefused, OSError) as e:
            self._events.append(JobLaunchFailed(job_id, time.time(), str(e)))
            return
        env = _job_env(user, placement.env)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in first)
        env["ARBITER_JOB_ID"] = job_id
        env["ARBITER_ALLOCATION"] = ";".join(
            f"{n}:{','.join(str(g) for g in gs)}" for n, gs in placement.gpus_by_node.items()
        )
        missing = program.missing(placement.command, env.get("PATH"), workdir)
        stdin: Any = subprocess.DEVNULL
        try:
            if missing is not None:
                raise FileNotFoundError(missing)
            if user.switch:  # the job's shell reads its environment after the switch
                stdin = tempfile.TemporaryFile()
                stdin.write(env_script(env))
                stdin.seek(0)
                env = _base_env(None)
            command = user.command(placement.command)
            with self.log_path(job_id).open("ab") as log:
                popen = subprocess.Popen(
                    ["/bin/sh", "-c", _WRAPPER, "arbiter-job", command, str(rc_path)],
                    stdin=stdin,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=workdir,
                    umask=0o022,
                    start_new_session=True,
                )
        except (OSError, ValueError, JobRefused) as e:  # exec refused it: E2BIG, a NUL byte, ...
            self._events.append(JobLaunchFailed(job_id, time.time(), _launch_error(e)))
            return
        finally:
            if stdin is not subprocess.DEVNULL:
                stdin.close()
        proc = _Proc(job_id, popen.pid, _start_ticks(popen.pid), gpus, nodes, popen)
        self._procs[job_id] = proc
        self._save(proc)

    def _workdir(self, job_id: str, user: JobUser) -> Path:
        """The job's own working directory (kept across its runs, so it finds what it left
        there after a preemption), owned by its user, mode 0700. The root above it only lets
        users pass through (0711): no one lists the other jobs."""
        self.jobs_root.mkdir(parents=True, exist_ok=True)
        self.jobs_root.chmod(0o711)
        path = self.jobs_root / job_id
        path.mkdir(mode=0o700, exist_ok=True)
        if user.switch:
            os.chown(path, user.uid, user.gid)
        return path

    def _exited(self, proc: _Proc, now: float) -> None:
        del self._procs[proc.job_id]
        _signal_group(proc.pid, signal.SIGKILL)  # stragglers the job left behind
        rc_path = self.dir / f"{proc.job_id}.rc"
        rc = _read_rc(rc_path)
        (self.dir / f"{proc.job_id}.json").unlink(missing_ok=True)
        if proc.job_id in self._deferred:
            return  # the next run is waiting to start: this exit is the old run's
        if rc is not None:  # when it really ended: it may have been while nobody watched
            try:
                now = min(now, rc_path.stat().st_mtime)
            except OSError:
                pass
        if proc.stopping:
            self._events.append(JobStopped(proc.job_id, now))
        elif rc == 0:
            self._events.append(JobFinished(proc.job_id, now))
        else:
            self._events.append(JobFailed(proc.job_id, now, -9 if rc is None else rc))

    def _alive(self, proc: _Proc) -> bool:
        if proc.popen is not None:
            return proc.popen.poll() is None
        return _runs(proc.pid, proc.start_ticks)

    def _save(self, proc: _Proc) -> None:
        state = {
            "job_id": proc.job_id,
            "pid": proc.pid,
            "start_ticks": proc.start_ticks,
            "gpus": sorted(proc.gpus),
            "nodes": list(proc.nodes),
            "stopping": proc.stopping,
            "kill_at": proc.kill_at,
        }
        path = self.dir / f"{proc.job_id}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, path)

    def _adopt(self) -> None:
        """Take over the processes a previous backend started (after a control-plane restart)."""
        for path in sorted(self.dir.glob("*.json")):
            try:
                s = json.loads(path.read_text())
                proc = _Proc(
                    job_id=s["job_id"],
                    pid=int(s["pid"]),
                    start_ticks=int(s["start_ticks"]),
                    gpus={(n, int(g)) for n, g in s["gpus"]},
                    nodes=tuple(s["nodes"]),
                    stopping=bool(s["stopping"]),
                    kill_at=s["kill_at"],
                )
            except (OSError, ValueError, KeyError, TypeError):
                path.unlink(missing_ok=True)  # a state file torn by a crash: nothing to adopt
                continue
            self._procs[proc.job_id] = proc


def kill_leftovers(state_dir: str | Path) -> list[str]:
    """Kill (SIGKILL, whole process groups) the jobs a backend over `state_dir` left running,
    and return their ids: for tests and tools that must leave no process behind after a server
    they started is gone. A server that is still up should be drained instead."""
    killed = []
    for path in sorted(Path(state_dir).glob("*.json")):
        try:
            s = json.loads(path.read_text())
            pid, ticks = int(s["pid"]), int(s["start_ticks"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _runs(pid, ticks):
            _signal_group(pid, signal.SIGKILL)
            killed.append(str(s.get("job_id", path.stem)))
    return killed


def _base_env(user: JobUser | None) -> dict[str, str]:
    """What every job process gets from the host, and no more: the server's own variables
    (ARBITER_ADMIN_TOKEN, database URLs, cloud credentials) never reach a job."""
    env = {
        "PATH": os.environ.get("PATH") or _DEFAULT_PATH,
        "LANG": os.environ.get("LANG") or "C.UTF-8",
    }
    if user is not None:
        env.update(HOME=user.home, USER=user.name, LOGNAME=user.name)
    return env


def _job_env(user: JobUser, own: Mapping[str, str]) -> dict[str, str]:
    return {**_base_env(user), **own}


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stat(pid: int) -> tuple[str, int] | None:
    """The process's state letter and start time in clock ticks; None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = stat.rsplit(")", 1)[1].split()
    return rest[0], int(rest[19])


def _start_ticks(pid: int) -> int:
    """The start time of our child `pid`, recorded so that a recycled pid is never mistaken
    for the job: read whatever the child's state, as a command as short as `true` may already
    have exited (a zombie until it is reaped, which keeps its start time)."""
    stat = _stat(pid)
    return 0 if stat is None else stat[1]


def _runs(pid: int, start_ticks: int) -> bool:
    """Whether the process started at `start_ticks` as `pid` still runs: not gone, not a
    zombie, not another process on a recycled pid. An unknown start (0) never matches, so a
    gone process is never taken for a live one."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z" and start_ticks != 0 and stat[1] == start_ticks


def _launch_error(e: Exception) -> str:
    if isinstance(e, OSError) and e.errno == errno.E2BIG:
        return f"the job's environment and command are too large for exec ({e.strerror})"
    if isinstance(e, ValueError):
        return f"the job's command or environment cannot be passed to exec: {e}"
    return str(e)


def _read_rc(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
