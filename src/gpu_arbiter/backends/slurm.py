"""Run Arbiter's decisions as Slurm jobs, through Slurm's own command-line tools.

Arbiter decides; Slurm executes. A `Start` becomes one `sbatch` with exactly the chosen nodes
(`--nodelist`) and the chosen number of GPUs on each (`--gres=gpu:TYPE:N`; a multi-node job with
different counts per node becomes a heterogeneous job, one component per node). The partition
should be Arbiter's alone: a job that Slurm, not Arbiter, placed there would take GPUs the engine
counts as free.

Which GPU indices: a gres request names a count, not indices, and Slurm picks the indices on each
node itself. Arbiter adopts Slurm's choice rather than overriding `CUDA_VISIBLE_DEVICES`, because
on a real cluster `ConstrainDevices=yes` hides every other device from the job: once a job runs,
`poll` reads the `GRES=gpu:h100:2(IDX:0-1)` lines of `scontrol show -d job`, and where they differ
from the engine's choice it reports a `JobPlaced` event with the indices the job really has,
which the control plane records as the job's allocation. Counts per node always match, so the
engine's capacity books stay right. Slurm forgets the indices once a job has ended, so a job
that ends within one poll interval keeps the engine's indices in the record.

The batch script is a small wrapper: it runs the command, waits for it, and writes an exit
record (`<job>.exit`: exit code and end time) next to the job's log, so how a job ended is known
even after Slurm has forgotten it.

Launch failures found on the node: before it starts the command, the wrapper looks up its
program there as the local backend does before a start (`program`). When it is not there, the
wrapper writes why to `<job>.launch` and ends itself with `LAUNCH_FAILED_SIGNAL`, and the job is
a `JobLaunchFailed` (it never ran and costs nothing), not a run that exited 127. The signal is
the proof, not the record: the wrapper catches that signal while the command runs, so the job
itself cannot end its wrapper that way and pass a run it was charged for off as a launch
failure, whatever it writes to its files.

Files: Slurm writes a job's log and the wrapper its exit record as the job's user, so both live
under the jobs root, outside the server's private state: `<jobs_root>/.slurm/<job>.log` and
`.exit`, made for the job's user beforehand in a folder that is the server's, 0711 (the job
writes its own files but cannot replace them with links to the server's files, which
`GET /v1/jobs/{id}/log` would then read, nor list other jobs'). The job runs in its own
`<jobs_root>/<job>` (0700, its user's), as on the local backend. What only the server may
write, the `.stop` deadline, stays in the private state folder.

Stopping: with a grace, `scancel --signal=TERM --full` (the notice reaches every process of the
job at once) and, when the grace has run out, `scancel --batch --signal=USR2`, on which the
wrapper SIGKILLs the job's whole process group. The kill must not go through Slurm's own
cancel: a `scancel` (or `--signal=KILL --full`) makes slurmstepd send TERM and wait `KillWait`
before it kills, so a 60 s grace became 90 s. Should the job still run `KILL_FALLBACK_S` after
its deadline (a wrapper that is not there), a plain `scancel` ends it the slow way. The deadline
is kept in `<job>.stop` too, so a control plane that restarts during the grace kills on time.
Without a grace (tier 3) a plain `scancel` at once. A stopped job is reported only when Slurm
says it is gone (not while it is COMPLETING), so its GPUs are never handed out while its
processes live.

Failures: a job that ends in `NODE_FAIL` (its node was set down, failed or lost its slurmd, even
if `ReturnToService` brought the node back before any `sinfo` saw it down), or that failed while
one of its nodes is down, is reported `JobLost`, not `JobFailed`: the job did nothing wrong and
is requeued from its checkpoint. An `sbatch` that Slurm refuses is `JobLaunchFailed` with
Slurm's error; one that could not reach Slurm is retried on the next polls (adopting the job
if the submission had in fact gone through).

After a control-plane restart, `outcome` says how a job that is no longer running ended: from
`sacct` when Slurm keeps accounting, else `scontrol show job` while Slurm still holds the job
(`MinJobAge`), else Slurm's job completion log (`sacct -c`, when `JobCompType=jobcomp/filetxt`),
else the exit record. The exit record is the job's own file, so a job could write an earlier
end into it to shorten its bill; its end is never put before the server last knew the job
running (its last accrual or report), nor before the file last changed, nor after the restart.

Nodes: every `poll_interval_s`, `sinfo -N` gives node states; a drained, down or unresponsive
node becomes `NodeDown` (with Slurm's reason), and back in service `NodeUp`. `inventory()` turns
`scontrol show node` and `scontrol show topology` into the nodes Arbiter registers.

Jobs are named `arbiter-<job id>`, so a new backend (after a control-plane restart) adopts the
jobs Slurm still runs from `squeue` alone, whichever user they run as.

Identities and shape (slurm_shape.py): a team's jobs run as its `run_as` user (`sbatch
--uid/--gid` when Arbiter runs as root; an unknown user, or another user while Arbiter is not
root, is a `JobLaunchFailed` naming it) and carry its `--account`, CPUs, memory and extra
arguments, and `--time` from the walltime estimate. As on the local backend, a team job is not
run as root (no `run_as` while Arbiter is root, or `run_as` root) unless `allow_root`. The jobs
root's parents must be traversable (`x`) by the teams' users.
"""

from __future__ import annotations

import logging
import math
import os
import pwd
import re
import shlex
import signal
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpu_arbiter.backends import program
from gpu_arbiter.backends.base import Placement, Running
from gpu_arbiter.backends.identity import root_refused
from gpu_arbiter.backends.slurm_inventory import (
    SlurmJob,
    SlurmNode,
    is_fault,
    parse_exit_code,
    parse_fields,
    parse_job_gpus,
    parse_nodes,
    parse_squeue,
    parse_topology,
)
from gpu_arbiter.backends.slurm_shape import SlurmSettings
from gpu_arbiter.domain import ArbiterError, Event, InvalidInput, JobFinished, JobStopped
from gpu_arbiter.domain.events import (
    JobFailed,
    JobLaunchFailed,
    JobLost,
    JobPlaced,
    NodeDown,
    NodeUp,
)

log = logging.getLogger("gpu_arbiter.backends.slurm")

PREFIX = "arbiter-"
# States in which a Slurm job holds (or is about to hold) its GPUs.
_ACTIVE = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "RESIZING",
        "STAGE_OUT",
        "SIGNALING",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESV_DEL_HOLD",
        "STOPPED",
    }
)
# Terminal states that are not a clean end: the job failed on its own (unless we stopped it).
_FAILED = frozenset(
    {
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "CANCELLED",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)


# States that say the job's node failed, not the job.
_NODE_FAILED = frozenset({"NODE_FAIL", "BOOT_FAIL"})
# Slurm's words for "could not reach the controller": worth trying again, not a refusal.
_TRANSIENT = re.compile(
    r"Unable to contact|Socket timed out|temporarily unavailable|Connection refused|"
    r"Zero Bytes were transmitted|Slurm backup controller in standby mode",
    re.I,
)
# Seconds after a kill deadline before a job still running is cancelled through Slurm itself.
KILL_FALLBACK_S = 10.0
# How long one read of Slurm's job completion log answers `outcome` (see `_outcome_jobcomp`).
JOBCOMP_REUSE_S = 10.0
# The signal the batch wrapper ends itself with when the command's program is not on the node.
LAUNCH_FAILED_SIGNAL = signal.SIGUSR1


class SlurmError(ArbiterError):
    """A Slurm command failed (its stderr is the message). `transient`: Slurm could not be
    reached, so the same command may well succeed later."""

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(slots=True)
class _Job:
    job_id: str
    slurm_id: str
    placement: Placement | None
    stopping: bool = False
    kill_at: float | None = None
    killed: bool = False
    placed: bool = False


class SlurmBackend:
    name = "slurm"

    def __init__(
        self,
        state_dir: str | Path,
        partition: str | None = None,
        poll_interval_s: float = 2.0,
        settings: SlurmSettings | None = None,
        slurm_conf: str | None = None,
        timeout_s: float = 30.0,
        jobs_root: str | Path | None = None,
        allow_root: bool = False,
    ) -> None:
        """`state_dir` holds what only the server writes (stop deadlines); `jobs_root` the
        jobs' working directories and Slurm's files of each job (default: `<state_dir>-work`
        beside it); `allow_root` lets team jobs run as root."""
        if poll_interval_s < 0:
            raise InvalidInput(
                f"slurm backend: poll_interval_s must be >= 0, got {poll_interval_s}"
            )
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        root = Path(jobs_root) if jobs_root is not None else None
        self.jobs_root = root or self.dir.with_name(self.dir.name + "-work")
        self.files = self.jobs_root / ".slurm"  # a job id never starts with a dot
        self.allow_root = allow_root
        self.partition = partition
        self.poll_interval_s = poll_interval_s
        self.settings = settings or SlurmSettings()
        self.timeout_s = timeout_s
        self._env = dict(os.environ)
        if slurm_conf is not None:
            self._env["SLURM_CONF"] = slurm_conf
        self._jobs: dict[str, _Job] = {}
        self._jobcomp: tuple[float, str] | None = None  # (when, what `sacct -c` printed)
        self._unsent: dict[str, Placement] = {}  # sbatch could not reach Slurm: try again
        self._events: list[Event] = []
        self._node_fault: dict[str, bool] = {}
        self._last_query = -float("inf")
        self._adopt()
        self._check_foreign()

    # -- the Backend interface -------------------------------------------------------------

    def start(self, placement: Placement) -> None:
        if not placement.gpus_by_node:
            raise InvalidInput(f"slurm backend: job {placement.job_id} has no nodes")
        old = self._jobs.get(placement.job_id)
        if old is not None and not old.stopping:
            raise InvalidInput(f"slurm backend: job {placement.job_id} already runs")
        self._exit_record(placement.job_id).unlink(missing_ok=True)
        self._launch_record(placement.job_id).unlink(missing_ok=True)
        self._stop_record(placement.job_id).unlink(missing_ok=True)
        self._submit(placement)

    def _submit(self, placement: Placement) -> None:
        job_id = placement.job_id
        try:
            owner = self._owner(placement)
            self._prepare(placement, owner)
        except (InvalidInput, OSError) as e:
            self._events.append(JobLaunchFailed(job_id, time.time(), str(e)))
            return
        try:
            out = self._run(
                ["sbatch", "--parsable", *self._sbatch_args(placement, owner)],
                stdin=self._script(placement, owner is not None),
                env=self._submit_env(owner),
            )
        except SlurmError as e:
            if e.transient:
                log.warning("job %s: sbatch will be tried again: %s", job_id, e)
                self._unsent[job_id] = placement
            else:
                self._events.append(JobLaunchFailed(job_id, time.time(), f"sbatch: {e}"))
            return
        self._unsent.pop(job_id, None)
        slurm_id = out.strip().split(";", 1)[0]
        self._jobs[job_id] = _Job(job_id, slurm_id, placement)
        log.info("job %s submitted as Slurm job %s", job_id, slurm_id)

    def _resend(self) -> None:
        """Submit again what could not reach Slurm, unless it did get through after all."""
        for job_id, placement in list(self._unsent.items()):
            try:
                rows = self._squeue("--name", PREFIX + job_id)
            except SlurmError:
                return  # still unreachable
            active = [r for r in rows if r.state in _ACTIVE]
            if active:
                del self._unsent[job_id]
                self._jobs[job_id] = _Job(job_id, active[-1].base_id, placement)
            else:
                self._submit(placement)

    def stop(self, job_id: str, grace_s: float) -> None:
        if self._unsent.pop(job_id, None) is not None:
            self._events.append(JobStopped(job_id, time.time()))
            return
        job = self._jobs.get(job_id)
        if job is None or job.stopping:
            return
        job.stopping = True
        if grace_s <= 0:
            self._scancel(job.slurm_id)
            job.killed = True
            return
        job.kill_at = time.monotonic() + grace_s
        # The deadline outlives this process: a control plane that restarts within the grace
        # still kills the job on time (`_adopt`).
        self._stop_record(job_id).write_text(f"{job.slurm_id} {time.time() + grace_s}\n")
        self._scancel(job.slurm_id, "--signal=TERM", "--full")

    def resize(self, placement: Placement) -> None:
        """Slurm cannot move a job to other GPUs: stop it at once and submit it again; Slurm
        starts the new one when the old one's GPUs are free."""
        job = self._jobs.pop(placement.job_id, None)
        if job is not None:
            self._scancel(job.slurm_id)
        self.start(placement)

    def poll(self) -> list[Event]:
        self._kill_due()
        if time.monotonic() - self._last_query >= self.poll_interval_s:
            self._last_query = time.monotonic()
            try:
                self._resend()
                self._poll_nodes(time.time())
                self._poll_jobs(time.time())
            except SlurmError as e:
                log.warning("slurm poll failed, will retry: %s", e)
            self._kill_due()  # a deadline may have passed while Slurm answered
        events, self._events = self._events, []
        return events

    def _kill_due(self) -> None:
        """Kill each stopping job whose grace has run out (see the module docstring)."""
        now_mono = time.monotonic()
        for job in self._jobs.values():
            if job.kill_at is None:
                continue
            if now_mono >= job.kill_at and not job.killed:
                # The deadline: the wrapper kills the command at once, whatever KillWait is.
                self._scancel(job.slurm_id, "--batch", "--signal=USR2")
                job.killed = True
            elif now_mono >= job.kill_at + KILL_FALLBACK_S:
                self._scancel(job.slurm_id)
                job.kill_at = None

    def running(self) -> list[Running]:
        out = [
            Running(j.job_id, tuple(j.placement.gpus_by_node) if j.placement else ())
            for j in self._jobs.values()
            if not j.stopping
        ]
        return out + [Running(j, tuple(p.gpus_by_node)) for j, p in self._unsent.items()]

    def outcome(self, job_id: str, since: float, alive_at: float | None = None) -> Event | None:
        """How a job Slurm no longer runs ended (after a control-plane restart), at its real
        end: from accounting, else from Slurm's memory of the job, else from Slurm's job
        completion log, else from the exit record its batch script wrote. None when none of
        them knows the run that began at `since`.

        Only the exit record is the job's word (its batch script runs as the job's user, and
        the job may rewrite the file), so its end is bounded by what the server knows: never
        before `alive_at` (when the server last knew the job running), nor before the record
        was last changed (its ctime, which no job can set back), nor after now."""
        for ask in (self._outcome_sacct, self._outcome_scontrol, self._outcome_jobcomp):
            try:
                ended = ask(job_id, since)
            except SlurmError as e:
                log.info("job %s: %s", job_id, e)
                continue
            if ended is not None:
                return ended
        return self._outcome_record(job_id, since, alive_at)

    def log_path(self, job_id: str) -> Path:
        return self.files / f"{job_id}.log"

    def shutdown(self) -> None:
        """Forget the jobs without cancelling them: they outlive a control-plane restart."""
        self._jobs.clear()

    # -- inventory -------------------------------------------------------------------------

    def inventory(self) -> list[SlurmNode]:
        """The GPU nodes of the partition with their type, count, rack and state."""
        racks: dict[str, str] = {}
        try:
            racks = parse_topology(self._run(["scontrol", "show", "topology"]), self.hostnames)
        except SlurmError:
            pass  # no topology plugin: every node in one rack
        return parse_nodes(self._run(["scontrol", "show", "node", "-o"]), racks, self.partition)

    def hostnames(self, hostlist: str) -> list[str]:
        if not any(c in hostlist for c in "[,"):
            return [hostlist]
        return self._run(["scontrol", "show", "hostnames", hostlist]).split()

    def slurm_id(self, job_id: str) -> str | None:
        job = self._jobs.get(job_id)
        return job.slurm_id if job else None

    # -- internals -------------------------------------------------------------------------

    def _owner(self, p: Placement) -> pwd.struct_passwd | None:
        """The user a job is submitted as, when not Arbiter's own (`--uid`, root only)."""
        if not p.run_as:
            if os.geteuid() == 0 and not self.allow_root:
                raise InvalidInput(str(root_refused(p.team, None)))
            return None
        try:
            user = pwd.getpwnam(p.run_as)
        except KeyError:
            raise InvalidInput(
                f"slurm backend: team {p.team!r} runs as {p.run_as!r}, which is no user here"
            ) from None
        if user.pw_uid == 0 and not self.allow_root:
            raise InvalidInput(str(root_refused(p.team, p.run_as)))
        if user.pw_uid == os.geteuid():
            return None
        if os.geteuid() != 0:
            raise InvalidInput(
                f"slurm backend: cannot submit team {p.team!r}'s job as {p.run_as!r}: "
                "Arbiter must run as root to submit as another user"
            )
        return user

    def _prepare(self, p: Placement, owner: pwd.struct_passwd | None) -> None:
        """The job's working directory (its user's, 0700, kept across its runs as on the local
        backend) and, for a job of another user, its log, exit and launch records made for that
        user (Slurm opens them as the job's user) in the server's 0711 folder of Slurm's files."""
        for folder in (self.jobs_root, self.files):
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(0o711)
        workdir = self.jobs_root / p.job_id
        workdir.mkdir(mode=0o700, exist_ok=True)
        if owner is None:
            return
        os.chown(workdir, owner.pw_uid, owner.pw_gid)
        if blocked := _untraversable(self.files, owner):
            raise InvalidInput(
                f"slurm backend: team {p.team!r}'s user {p.run_as!r} cannot reach its log in "
                f"{self.files}: {blocked} is closed to it (chmod o+x, docs/deployment.md)"
            )
        job_files = (self.log_path, self._exit_record, self._launch_record)
        for path in (f(p.job_id) for f in job_files):
            path.touch(mode=0o600)
            os.chown(path, owner.pw_uid, owner.pw_gid)

    def _submit_env(self, owner: pwd.struct_passwd | None) -> dict[str, str]:
        """sbatch's environment, which Slurm hands on to the job (`--export=ALL`, its default):
        as on the local backend, the host's PATH and LANG and the job user's HOME, USER and
        LOGNAME, never the server's own variables (ARBITER_ADMIN_TOKEN, database URLs, cloud
        credentials). SLURM_CONF stays: it names the Slurm to submit to."""
        user = owner or pwd.getpwuid(os.geteuid())
        env = {
            "PATH": self._env.get("PATH") or os.defpath,
            "LANG": self._env.get("LANG") or "C.UTF-8",
            "HOME": user.pw_dir,
            "USER": user.pw_name,
            "LOGNAME": user.pw_name,
        }
        if "SLURM_CONF" in self._env:
            env["SLURM_CONF"] = self._env["SLURM_CONF"]
        return env

    def _sbatch_args(self, p: Placement, owner: pwd.struct_passwd | None = None) -> list[str]:
        """sbatch's arguments for `p`, submitted as `owner` (None: Arbiter's own user)."""
        shape = self.settings.shape(p.team)
        common = [
            f"--job-name={PREFIX}{p.job_id}",
            f"--output={self.log_path(p.job_id)}",
            f"--chdir={self.jobs_root / p.job_id}",
            "--open-mode=append",
            "--no-requeue",
            "--ntasks-per-node=1",
        ]
        if self.partition:
            common.append(f"--partition={self.partition}")
        if p.team:
            common.append(f"--comment=team={p.team} tier={p.tier}")
        if owner is not None:
            common += [f"--uid={owner.pw_uid}", f"--gid={owner.pw_gid}"]
        if shape.account:
            common.append(f"--account={shape.account}")
        if p.walltime_s is not None:
            minutes = math.ceil((p.walltime_s + self.settings.time_margin) / 60)
            common.append(f"--time={minutes}")
        common.extend(shape.extra_sbatch_args)
        gtype = p.gpu_type.lower()

        def component(nodes: list[str], n: int) -> list[str]:
            args = [f"--nodes={len(nodes)}", f"--nodelist={','.join(nodes)}"]
            args.append(f"--gres=gpu:{gtype}:{n}")
            if shape.cpus_per_gpu:
                args.append(f"--cpus-per-gpu={shape.cpus_per_gpu}")
            if shape.mem_per_gpu:
                args.append(f"--mem-per-gpu={shape.mem_per_gpu}")
            return args

        counts = {len(g) for g in p.gpus_by_node.values()}
        if len(counts) == 1:
            return common + component(list(p.gpus_by_node), counts.pop())
        args = list(common)
        for i, (node, gpus) in enumerate(p.gpus_by_node.items()):
            if i:
                args.append(":")
            args += component([node], len(gpus))
        return args

    def _exit_record(self, job_id: str) -> Path:
        return self.files / f"{job_id}.exit"

    def _launch_record(self, job_id: str) -> Path:
        return self.files / f"{job_id}.launch"

    def _stop_record(self, job_id: str) -> Path:
        return self.dir / f"{job_id}.stop"

    def _script(self, p: Placement, as_other_user: bool = False) -> str:
        """The batch script: Arbiter's environment, then the command under a wrapper that
        waits for it (the notice, TERM, reaches the command from Slurm directly; the wrapper
        only defers it), SIGKILLs the job's whole process group, itself included, on USR2 (the
        deadline, see the module docstring) and writes the exit record either way.
        CUDA_VISIBLE_DEVICES is Slurm's; the script is sent on stdin, so the job token never
        appears on a command line or in a file outside Slurm's spool. A job of another user
        writes its exit record in place (the file is its own, the folder is not). Before any
        of that, the launch check (see the module docstring)."""
        env = {**p.env, "ARBITER_JOB_ID": p.job_id, "ARBITER_BACKEND": "slurm"}
        record = shlex.quote(str(self._exit_record(p.job_id)))
        lines = ["#!/bin/sh"]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
        if (word := program.program(p.command)) is not None:
            why = shlex.quote(program.not_found(word))
            launch = shlex.quote(str(self._launch_record(p.job_id)))
            sig = LAUNCH_FAILED_SIGNAL.name.removeprefix("SIG")
            lines.append(
                f"{program.shell_test(word)} || {{ echo {why} > {launch}; "
                f"echo arbiter: could not start: {why} >&2; kill -s {sig} $$; exit 127; }}"
            )
        write = f'echo "$rc $(date +%s)" > {record}.tmp && mv {record}.tmp {record}'
        if as_other_user:
            write = f'echo "$rc $(date +%s)" > {record}'
        lines += [
            f"trap : TERM {LAUNCH_FAILED_SIGNAL.name.removeprefix('SIG')}",
            f"trap 'rc=137; {write}; kill -KILL 0' USR2",
            f"/bin/sh -c {shlex.quote(p.command)} &",
            "child=$!",
            "while :; do wait $child; rc=$?; kill -0 $child 2>/dev/null || break; done",
            write,
            "exit $rc",
        ]
        return "\n".join(lines) + "\n"

    def _poll_jobs(self, now: float) -> None:
        if not self._jobs:
            return
        rows = self._squeue()
        by_id: dict[str, list[SlurmJob]] = {}
        for row in rows:
            by_id.setdefault(row.base_id, []).append(row)
        for job in list(self._jobs.values()):
            comps = by_id.get(job.slurm_id, [])
            states = {c.state for c in comps}
            if states & _ACTIVE:
                if "RUNNING" in states and not job.placed and not job.stopping:
                    self._check_placement(job, now)
                continue
            del self._jobs[job.job_id]
            self._stop_record(job.job_id).unlink(missing_ok=True)
            if job.stopping:
                self._events.append(JobStopped(job.job_id, now))
            elif states and states <= {"COMPLETED"}:
                self._events.append(JobFinished(job.job_id, now))
            elif failed := self._node_failure(comps):
                self._events.append(JobLost(job.job_id, now, failed))
            else:
                self._events.append(self._failed(job.job_id, now, self._exit_code(job, states)))

    def _node_failure(self, comps: list[SlurmJob]) -> str | None:
        """Why the job's end was its node's doing, or None: Slurm ended it NODE_FAIL, or it
        failed while one of its nodes is down (whichever Slurm reported first)."""
        for c in comps:
            if c.state in _NODE_FAILED:
                return f"Slurm job {c.slurm_id} on {c.nodes} ended {c.state}"
        for c in comps:
            try:
                names = self.hostnames(c.nodes) if c.nodes else []
            except SlurmError:
                names = []
            down = [n for n in names if self._node_fault.get(n)]
            if down and c.state in _FAILED:
                return f"Slurm job {c.slurm_id} ended {c.state} while {', '.join(down)} was down"
        return None

    def _check_placement(self, job: _Job, now: float) -> None:
        text = self._run(["scontrol", "show", "-d", "job", job.slurm_id])
        gpus = parse_job_gpus(text, self.hostnames)
        if not gpus:
            return  # not yet started on every node (a heterogeneous job starts as one)
        job.placed = True
        chosen = job.placement.gpus_by_node if job.placement else {}
        if {n: tuple(sorted(g)) for n, g in chosen.items()} != gpus:
            self._events.append(JobPlaced(job.job_id, now, tuple(sorted(gpus.items()))))

    def _exit_code(self, job: _Job, states: set[str]) -> int:
        """Slurm's exit code (negative: the signal) or -1 when Slurm no longer knows the job."""
        if not states:
            return -1
        try:
            code = parse_exit_code(self._run(["scontrol", "show", "job", "-o", job.slurm_id]))
        except SlurmError:
            code = None
        if code is None or code == 0:
            return -1
        return code

    def _poll_nodes(self, now: float) -> None:
        out = self._run(["sinfo", "-N", "-h", "-o", "%N|%T|%E", *self._partition_args()])
        for line in out.splitlines():
            name, _, rest = line.partition("|")
            state, _, reason = rest.partition("|")
            if not name:
                continue
            fault = is_fault(state)
            if self._node_fault.get(name) == fault:
                continue
            self._node_fault[name] = fault
            if fault:
                why = reason if reason and reason != "none" else state
                self._events.append(NodeDown(name, now, f"slurm: node {name} {state}: {why}"))
            else:
                self._events.append(NodeUp(name, now))

    def _squeue(self, *args: str, ours: bool = True) -> list[SlurmJob]:
        """The partition's jobs (every user's: teams' jobs run as their users), Arbiter's
        only unless `ours` is False."""
        out = self._run(
            ["squeue", "-h", "-t", "all", "-o", "%i|%T|%j|%N", *self._partition_args(), *args]
        )
        return [r for r in parse_squeue(out) if r.name.startswith(PREFIX) == ours]

    def _check_foreign(self) -> None:
        """Warn, or refuse to start (`foreign-jobs = "refuse"`), when jobs Arbiter did not
        submit hold or wait for the partition's GPUs, which the engine counts as free."""
        try:
            rows = [r for r in self._squeue(ours=False) if r.state in _ACTIVE]
        except SlurmError as e:
            log.warning("slurm: cannot list the partition's jobs: %s", e)
            return
        if not rows:
            return
        where = f"partition {self.partition}" if self.partition else "the cluster"
        shown = ", ".join(f"{r.base_id} ({r.name}, {r.state})" for r in rows[:5])
        more = f" and {len(rows) - 5} more" if len(rows) > 5 else ""
        message = (
            f"slurm backend: {len(rows)} job(s) Arbiter did not submit are in {where}: "
            f"{shown}{more}; Arbiter counts their GPUs as free"
        )
        if self.settings.foreign_jobs == "refuse":
            raise InvalidInput(message + ' (foreign-jobs = "refuse")')
        log.warning("%s", message)

    def _failed(self, job_id: str, at: float, code: int) -> JobFailed | JobLaunchFailed:
        """A job that ended with Slurm's exit `code` (minus the signal): a launch failure when
        its wrapper ended itself with `LAUNCH_FAILED_SIGNAL`, else a failed run."""
        if code != -LAUNCH_FAILED_SIGNAL:
            return JobFailed(job_id, at, code)
        try:
            with self._launch_record(job_id).open(errors="replace") as f:
                why = f.read(1000).strip()
        except OSError:
            why = ""
        return JobLaunchFailed(job_id, at, why or "its batch script found no program to start")

    def _ended(self, job_id: str, state: str, code: int, end: float) -> Event:
        if state == "COMPLETED" and code == 0:
            return JobFinished(job_id, end)
        if state in _NODE_FAILED:
            return JobLost(job_id, end, f"Slurm ended it {state}")
        return self._failed(job_id, end, code if code else -1)

    def _outcome_sacct(self, job_id: str, since: float) -> Event | None:
        """From Slurm's accounting (`sacct`), when the site keeps it."""
        start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since - 1))
        out = self._run(
            ["sacct", "-n", "-P", "-X", f"--name={PREFIX}{job_id}", f"--starttime={start}"]
            + ["--format=JobIDRaw,State,ExitCode,Submit,End"]
        )
        return parse_sacct(job_id, out, since, self._ended)

    def _outcome_scontrol(self, job_id: str, since: float) -> Event | None:
        """From Slurm's memory of the job (`MinJobAge` after its end)."""
        rows = [r for r in self._squeue("--name", PREFIX + job_id) if r.state not in _ACTIVE]
        if not rows:
            return None
        newest = max(rows, key=lambda r: int(r.base_id))
        f = parse_fields(self._run(["scontrol", "show", "job", "-o", newest.base_id]))
        submitted, end = slurm_time(f.get("SubmitTime")), slurm_time(f.get("EndTime"))
        if submitted is None or end is None or submitted < since - 1:
            return None  # an earlier run's, or the times are unreadable
        code = parse_exit_code(f"ExitCode={f.get('ExitCode', '')}") or 0
        return self._ended(job_id, f.get("JobState", newest.state), code, end)

    def _outcome_jobcomp(self, job_id: str, since: float) -> Event | None:
        """From Slurm's job completion log (`JobCompType=jobcomp/filetxt`, which `sacct -c`
        reads), where a site keeps no accounting database: Slurm writes each job's end there
        when it ends, and keeps it after it has forgotten the job. `sacct -c` reads the whole
        log whatever its filters, so one read serves the outcomes asked within
        `JOBCOMP_REUSE_S` (a restart asks for every job that ended while it was down)."""
        cached = self._jobcomp
        if cached is None or time.monotonic() - cached[0] > JOBCOMP_REUSE_S:
            out = self._run(
                ["sacct", "-c", "-n", "-P", "-X"]
                + ["--format=JobIDRaw,JobName,State,ExitCode,Submit,End"]
            )
            cached = self._jobcomp = (time.monotonic(), out)
        name = f"{PREFIX}{job_id}"
        lines = []
        for line in cached[1].splitlines():
            sid, _, rest = line.strip().partition("|")
            job_name, _, fields = rest.partition("|")
            if job_name == name:
                lines.append(f"{sid}|{fields}")
        return parse_sacct(job_id, "\n".join(lines), since, self._ended)

    def _outcome_record(self, job_id: str, since: float, alive_at: float | None) -> Event | None:
        """From the exit record the batch script wrote (`rc end`), if it is this run's, its
        end bounded as `outcome` says."""
        path = self._exit_record(job_id)
        try:
            changed = path.stat().st_ctime
            rc_text, end_text = path.read_text().split()
            rc, end = int(rc_text), float(end_text)
        except (OSError, ValueError):
            return None
        if end < since - 1:
            return None
        end = min(max(end, changed, end if alive_at is None else alive_at), time.time())
        return JobFinished(job_id, end) if rc == 0 else JobFailed(job_id, end, rc)

    def _adopt(self) -> None:
        """Take over the jobs a previous control plane started (their names say whose)."""
        try:
            rows = self._squeue()
        except SlurmError as e:
            log.warning("slurm: cannot list jobs to adopt: %s", e)
            return
        for row in rows:
            job_id = row.name[len(PREFIX) :]
            if row.state in _ACTIVE and job_id not in self._jobs:
                job = self._jobs[job_id] = _Job(job_id, row.base_id, None)
                try:
                    slurm_id, deadline = self._stop_record(job_id).read_text().split()
                    left = float(deadline) - time.time()
                except (OSError, ValueError):
                    continue
                if slurm_id == row.base_id:  # being stopped: keep its kill deadline
                    job.stopping, job.kill_at = True, time.monotonic() + left

    def _partition_args(self) -> list[str]:
        return [f"--partition={self.partition}"] if self.partition else []

    def _scancel(self, slurm_id: str, *args: str) -> None:
        try:
            self._run(["scancel", *args, slurm_id])
        except SlurmError as e:
            log.warning("scancel %s failed: %s", slurm_id, e)

    def _run(
        self, argv: list[str], stdin: str | None = None, env: dict[str, str] | None = None
    ) -> str:
        try:
            res = subprocess.run(
                argv,
                input=stdin,
                capture_output=True,
                text=True,
                env=self._env if env is None else env,
                timeout=self.timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SlurmError(f"{argv[0]}: {e}", transient=True) from e
        if res.returncode != 0:
            err = res.stderr.strip()
            raise SlurmError(
                f"{shlex.join(argv)}: {err or res.returncode}",
                transient=bool(_TRANSIENT.search(err)),
            )
        return res.stdout


def _untraversable(folder: Path, user: pwd.struct_passwd) -> Path | None:
    """The first of `folder` and its parents that `user` may not enter (Slurm opens the job's
    log there as that user), or None."""
    groups = set(os.getgrouplist(user.pw_name, user.pw_gid))
    for path in (folder, *folder.parents):
        st = path.stat()
        if st.st_uid == user.pw_uid:
            bit = stat.S_IXUSR
        elif st.st_gid in groups:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return path
    return None


def slurm_time(text: str | None) -> float | None:
    """`2026-12-07T12:30:08` (Slurm's local time) as epoch seconds; None for `Unknown`."""
    try:
        return time.mktime(time.strptime(text or "", "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def parse_sacct(
    job_id: str, text: str, since: float, ended: Callable[[str, str, int, float], Event]
) -> Event | None:
    """The newest finished run submitted since `since` in `sacct -n -P -X
    --format=JobIDRaw,State,ExitCode,Submit,End` lines, as `ended(job_id, state, code, end)`."""
    best: tuple[int, Event] | None = None
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5 or not parts[0].isdigit():
            continue
        sid, state, code_text, submit_text, end_text = parts
        state = state.split()[0].upper()  # "CANCELLED by 0"
        submitted, end = slurm_time(submit_text), slurm_time(end_text)
        if state in _ACTIVE or submitted is None or end is None or submitted < since - 1:
            continue
        code = parse_exit_code(f"ExitCode={code_text}") or 0
        if best is None or int(sid) > best[0]:
            best = (int(sid), ended(job_id, state, code, end))
    return best[1] if best else None
