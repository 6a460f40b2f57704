"""Alibaba PAI 2020 traces (Weng et al., NSDI '22; alibaba/clusterdata cluster-trace-gpu-v2020).

Two headerless CSVs, joined by `job_name`, give one job each:

* `pai_job_table.csv`: job_name, inst_id, user, status, start_time, end_time
  (`start_time` is the submission);
* `pai_task_table.csv`: job_name, task_name, inst_num, status, start_time, end_time, plan_cpu,
  plan_mem, plan_gpu, gpu_type (`plan_gpu` in percent of a GPU per instance: 100 = one GPU).

The path is the job table or a directory holding both; the task table is read from beside it.
The task table is read once into a per-job aggregate (memory grows with the number of jobs, not
of rows); the job table is streamed.

Mapping: GPUs = sum over tasks of `inst_num * plan_gpu / 100`: below one GPU, a fractional GPU
(`gpu_milli` = the share); otherwise that many whole GPUs, rounded up. Run time = the last task
end - the first task start; submit = the job's `start_time`; team hashed by `user`; tier from
the mix. Skipped: no GPU (`cpu_only`), no tasks (`no_tasks`), no task started
(`never_started`), a GPU task without end (`unfinished`), zero run time. Bad task rows count
as `task.<field>`.

GPU type: `gpu_type` of the job's largest GPU task sets the speed the run time was measured at
(`PAI_SOURCE_SPEEDS`; MISC, older mixed cards, counts as P100-class). It is not a constraint:
the trace records where a task ran, not what it required.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_arbiter.domain import GPU_CATALOG, MILLI, InvalidInput, JobSpec
from gpu_arbiter.traces.base import (
    BadField,
    ReadStats,
    RecordPass,
    Reporter,
    Skip,
    TraceOptions,
    TraceReader,
    TraceRecord,
    as_float,
    as_int,
    csv_rows,
    required_id,
)
from gpu_arbiter.traces.hardware import P100, T4, V100M32

JOB_COLUMNS = ["job_name", "inst_id", "user", "status", "start_time", "end_time"]
TASK_COLUMNS = [
    "job_name",
    "task_name",
    "inst_num",
    "status",
    "start_time",
    "end_time",
    "plan_cpu",
    "plan_mem",
    "plan_gpu",
    "gpu_type",
]
JOB_TABLE = "pai_job_table.csv"
TASK_TABLE = "pai_task_table.csv"
PAI_SOURCE_SPEEDS: dict[str, float] = {
    "V100": GPU_CATALOG["V100"].speed,
    "V100M32": V100M32.speed,
    "P100": P100.speed,
    "T4": T4.speed,
    "MISC": P100.speed,
}
_FIELDS = frozenset(("job_name", "inst_id", "user", "status", "gpu_type"))


@dataclass(slots=True)
class _JobTasks:
    """What the task table says about one job."""

    gpu_percent: float = 0.0
    first_start: float = math.inf
    last_end: float = -math.inf
    unfinished: bool = False
    gpu_type: str = ""
    largest: float = 0.0


class PaiReader(TraceReader):
    name = "pai2020"
    fields = _FIELDS

    def locate(self, path: Path) -> Path:
        job_table = path / JOB_TABLE if path.is_dir() else path
        for needed in (job_table, job_table.parent / TASK_TABLE):
            if not needed.is_file():
                raise InvalidInput(f"pai2020 trace: file not found: {needed}")
        return job_table

    def records(self, path: Path, report: Reporter, options: TraceOptions) -> RecordPass:
        task_table = path.parent / TASK_TABLE
        tasks = _index_tasks(
            task_table, Reporter(str(task_table), report.stats, report.strict, "task.")
        )

        def read_pass(rep: Reporter) -> Generator[tuple[int, Any], None, None]:
            for row, job in csv_rows(path, rep, JOB_COLUMNS, columns=JOB_COLUMNS):
                yield row, (job, tasks.get(job["job_name"]))

        return read_pass

    def parse(self, row: int, record: Any) -> TraceRecord | Skip:
        job, tasks = record
        name = required_id(job, "job_name")
        submit = as_float(job["start_time"], "start_time")
        if tasks is None:
            return Skip("no_tasks")
        if tasks.gpu_percent <= 0:
            return Skip("cpu_only")
        if tasks.unfinished:
            return Skip("unfinished")
        if tasks.first_start == math.inf:
            return Skip("never_started")
        run_s = tasks.last_end - tasks.first_start
        if run_s <= 0:
            return Skip("zero_duration")
        if tasks.gpu_percent < 100:
            gpus, milli = 1, max(1, round(tasks.gpu_percent * 10))
        else:
            gpus, milli = math.ceil(tasks.gpu_percent / 100 - 1e-9), MILLI
        user = job["user"].strip()
        return TraceRecord(
            id=name,
            submit_s=submit,
            run_s=run_s,
            gpus=gpus,
            gpu_milli=milli,
            source_speed=PAI_SOURCE_SPEEDS.get(tasks.gpu_type, PAI_SOURCE_SPEEDS["MISC"]),
            fields={**{c: job[c].strip() for c in JOB_COLUMNS}, "gpu_type": tasks.gpu_type},
            user=user or None,
        )


def _index_tasks(path: Path, report: Reporter) -> dict[str, _JobTasks]:
    index: dict[str, _JobTasks] = {}
    for row, task in csv_rows(path, report, TASK_COLUMNS, columns=TASK_COLUMNS):
        try:
            instances = as_int(task["inst_num"], "inst_num")
            plan_gpu = as_float(task["plan_gpu"], "plan_gpu") if task["plan_gpu"].strip() else 0.0
            start = (
                as_float(task["start_time"], "start_time") if task["start_time"].strip() else None
            )
            end = as_float(task["end_time"], "end_time") if task["end_time"].strip() else None
            if instances < 0 or plan_gpu < 0:
                raise BadField("inst_num" if instances < 0 else "plan_gpu", "must be >= 0")
            if start is not None and end is not None and end < start:
                raise BadField("end_time", f"before start_time ({start})")
        except BadField as exc:
            report.bad(row, exc.field, exc.message)
            continue
        agg = index.setdefault(task["job_name"].strip(), _JobTasks())
        share = instances * plan_gpu
        agg.gpu_percent += share
        if share > agg.largest:
            agg.largest = share
            agg.gpu_type = task["gpu_type"].strip()
        if start is not None:
            agg.first_start = min(agg.first_start, start)
            if end is None:
                agg.unfinished = agg.unfinished or share > 0
            else:
                agg.last_end = max(agg.last_end, end)
    return index


_READER = PaiReader()


def read_pai(
    path: str | Path, options: TraceOptions | None = None, stats: ReadStats | None = None
) -> Iterator[JobSpec]:
    """Stream the jobs of a PAI 2020 job table joined with its task table."""
    return _READER.read(path, options, stats)
