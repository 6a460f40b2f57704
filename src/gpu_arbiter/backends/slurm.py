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

Stopping: with a grace, `scancel --signal=TERM --full` (the batch shell and every step get the
notice) and, once the grace has run out, `scancel --signal=KILL --full` then `scancel`; without
a grace (tier 3) a plain `scancel` at once. A stopped job is reported only when Slurm says it is
gone (not while it is COMPLETING), so its GPUs are never handed out while its processes live.

Nodes: every `poll_interval_s`, `sinfo -N` gives node states; a drained, down or unresponsive
node becomes `NodeDown` (with Slurm's reason), and back in service `NodeUp`. `inventory()` turns
`scontrol show node` and `scontrol show topology` into the nodes Arbiter registers.

Jobs are named `arbiter-<job id>`, so a new backend (after a control-plane restart) adopts the
jobs Slurm still runs from `squeue` alone.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpu_arbiter.backends.base import Placement, Running
from gpu_arbiter.backends.slurm_inventory import (
    SlurmJob,
    SlurmNode,
    is_fault,
    parse_exit_code,
    parse_job_gpus,
    parse_nodes,
    parse_squeue,
    parse_topology,
)
from gpu_arbiter.domain import ArbiterError, Event, InvalidInput, JobFinished, JobStopped
from gpu_arbiter.domain.events import JobFailed, JobPlaced, NodeDown, NodeUp

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


class SlurmError(ArbiterError):
    """A Slurm command failed (its stderr is the message)."""


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
        cpus_per_gpu: int | None = None,
        extra_sbatch_args: Sequence[str] = (),
        slurm_conf: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        if poll_interval_s < 0:
            raise InvalidInput(
                f"slurm backend: poll_interval_s must be >= 0, got {poll_interval_s}"
            )
        if cpus_per_gpu is not None and cpus_per_gpu < 1:
            raise InvalidInput(f"slurm backend: cpus_per_gpu must be >= 1, got {cpus_per_gpu}")
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.partition = partition
        self.poll_interval_s = poll_interval_s
        self.cpus_per_gpu = cpus_per_gpu
        self.extra_sbatch_args = tuple(extra_sbatch_args)
        self.timeout_s = timeout_s
        self._env = dict(os.environ)
        if slurm_conf is not None:
            self._env["SLURM_CONF"] = slurm_conf
        self._jobs: dict[str, _Job] = {}
        self._events: list[Event] = []
        self._node_fault: dict[str, bool] = {}
        self._last_query = -float("inf")
        self._adopt()

    # -- the Backend interface -------------------------------------------------------------

    def start(self, placement: Placement) -> None:
        if not placement.gpus_by_node:
            raise InvalidInput(f"slurm backend: job {placement.job_id} has no nodes")
        old = self._jobs.get(placement.job_id)
        if old is not None and not old.stopping:
            raise InvalidInput(f"slurm backend: job {placement.job_id} already runs")
        out = self._run(
            ["sbatch", "--parsable", *self._sbatch_args(placement)], stdin=self._script(placement)
        )
        slurm_id = out.strip().split(";", 1)[0]
        self._jobs[placement.job_id] = _Job(placement.job_id, slurm_id, placement)
        log.info("job %s submitted as Slurm job %s", placement.job_id, slurm_id)

    def stop(self, job_id: str, grace_s: float) -> None:
        job = self._jobs.get(job_id)
        if job is None or job.stopping:
            return
        job.stopping = True
        if grace_s <= 0:
            self._scancel(job.slurm_id)
            job.killed = True
            return
        job.kill_at = time.monotonic() + grace_s
        self._scancel(job.slurm_id, "--signal=TERM", "--full")

    def resize(self, placement: Placement) -> None:
        """Slurm cannot move a job to other GPUs: stop it at once and submit it again; Slurm
        starts the new one when the old one's GPUs are free."""
        job = self._jobs.pop(placement.job_id, None)
        if job is not None:
            self._scancel(job.slurm_id)
        self.start(placement)

    def poll(self) -> list[Event]:
        now_mono = time.monotonic()
        for job in self._jobs.values():
            if job.kill_at is not None and now_mono >= job.kill_at and not job.killed:
                self._scancel(job.slurm_id, "--signal=KILL", "--full")
                self._scancel(job.slurm_id)
                job.killed = True
        if now_mono - self._last_query >= self.poll_interval_s:
            self._last_query = now_mono
            try:
                self._poll_jobs(time.time())
                self._poll_nodes(time.time())
            except SlurmError as e:
                log.warning("slurm poll failed, will retry: %s", e)
        events, self._events = self._events, []
        return events

    def running(self) -> list[Running]:
        return [
            Running(j.job_id, tuple(j.placement.gpus_by_node) if j.placement else ())
            for j in self._jobs.values()
            if not j.stopping
        ]

    def log_path(self, job_id: str) -> Path:
        return self.dir / f"{job_id}.log"

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

    def _sbatch_args(self, p: Placement) -> list[str]:
        common = [
            f"--job-name={PREFIX}{p.job_id}",
            f"--output={self.log_path(p.job_id)}",
            "--open-mode=append",
            "--no-requeue",
            "--ntasks-per-node=1",
        ]
        if self.partition:
            common.append(f"--partition={self.partition}")
        if p.team:
            common.append(f"--comment=team={p.team} tier={p.tier}")
        common.extend(self.extra_sbatch_args)
        gtype = p.gpu_type.lower()

        def component(nodes: list[str], n: int) -> list[str]:
            args = [f"--nodes={len(nodes)}", f"--nodelist={','.join(nodes)}"]
            args.append(f"--gres=gpu:{gtype}:{n}")
            if self.cpus_per_gpu:
                args.append(f"--cpus-per-gpu={self.cpus_per_gpu}")
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

    def _script(self, p: Placement) -> str:
        """The batch script: Arbiter's environment, then the command. CUDA_VISIBLE_DEVICES is
        Slurm's (see the module docstring); the script is sent on stdin, so the job token never
        appears on a command line or in a file outside Slurm's spool."""
        env = {**p.env, "ARBITER_JOB_ID": p.job_id, "ARBITER_BACKEND": "slurm"}
        lines = ["#!/bin/sh"]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
        lines.append(f"exec /bin/sh -c {shlex.quote(p.command)}")
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
            if job.stopping:
                self._events.append(JobStopped(job.job_id, now))
            elif states and states <= {"COMPLETED"}:
                self._events.append(JobFinished(job.job_id, now))
            else:
                self._events.append(JobFailed(job.job_id, now, self._exit_code(job, states)))

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

    def _squeue(self) -> list[SlurmJob]:
        out = self._run(["squeue", "--me", "-h", "-t", "all", "-o", "%i|%T|%j|%N"])
        return [r for r in parse_squeue(out) if r.name.startswith(PREFIX)]

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
                self._jobs[job_id] = _Job(job_id, row.base_id, None)

    def _partition_args(self) -> list[str]:
        return [f"--partition={self.partition}"] if self.partition else []

    def _scancel(self, slurm_id: str, *args: str) -> None:
        try:
            self._run(["scancel", *args, slurm_id])
        except SlurmError as e:
            log.warning("scancel %s failed: %s", slurm_id, e)

    def _run(self, argv: list[str], stdin: str | None = None) -> str:
        try:
            res = subprocess.run(
                argv,
                input=stdin,
                capture_output=True,
                text=True,
                env=self._env,
                timeout=self.timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SlurmError(f"{argv[0]}: {e}") from e
        if res.returncode != 0:
            raise SlurmError(f"{shlex.join(argv)}: {res.stderr.strip() or res.returncode}")
        return res.stdout
