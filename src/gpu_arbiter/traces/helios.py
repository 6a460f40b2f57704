"""SenseTime Helios traces (Hu et al., SC '21; github.com/S-Lab-System-Group/HeliosData).

Each cluster's `cluster_log.csv` has `job_id, user, vc, [jobname,] gpu_num, cpu_num,
node_num, state, submit_time, start_time, end_time, duration, queue`: times are date-times
("2020-06-09 18:41:01"; epoch seconds are accepted too), `duration` and `queue` are seconds of
run and of queueing (so `queue` is no priority class).

Mapping: a job is `helios-<job_id>` with `gpu_num` GPUs, submitted at `submit_time`, running
`duration` seconds (`end_time - start_time` where `duration` is empty); team = `vc`; tier
from the mix. Skipped: `gpu_num` 0 (`cpu_only`, about half the log) and zero run time.

GPU type: the public Venus and Earth clusters are V100 clusters, so run times are taken as
measured at V100 speed (`HELIOS_SOURCE_SPEED`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpu_arbiter.domain import GPU_CATALOG, JobSpec
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
    as_time,
    csv_rows,
    gpu_count,
    required_id,
)

HELIOS_SOURCE_SPEED = GPU_CATALOG["V100"].speed
_REQUIRED = ("job_id", "gpu_num", "submit_time")
_FIELDS = frozenset(("job_id", "user", "vc", "jobname", "state"))


class HeliosReader(TraceReader):
    name = "helios"
    fields = _FIELDS
    team_field = "vc"

    def records(self, path: Path, report: Reporter, options: TraceOptions) -> RecordPass:
        return lambda rep: csv_rows(path, rep, _REQUIRED)

    def parse(self, row: int, record: Any) -> TraceRecord | Skip:
        job_id = required_id(record, "job_id")
        gpus = gpu_count(record, "gpu_num")
        if isinstance(gpus, Skip):
            return gpus
        if (record.get("duration") or "").strip():
            run_s = as_float(record["duration"], "duration")
        else:
            run_s = as_time(record.get("end_time"), "end_time") - as_time(
                record.get("start_time"), "start_time"
            )
        if run_s < 0:
            raise BadField("duration", f"must be >= 0, got {run_s}")
        if run_s == 0:
            return Skip("zero_duration")
        user = (record.get("user") or "").strip()
        return TraceRecord(
            id=f"helios-{job_id}",
            submit_s=as_time(record["submit_time"], "submit_time"),
            run_s=run_s,
            gpus=gpus,
            source_speed=HELIOS_SOURCE_SPEED,
            fields={name: (record.get(name) or "").strip() for name in _FIELDS},
            user=user or None,
        )


_READER = HeliosReader()


def read_helios(
    path: str | Path, options: TraceOptions | None = None, stats: ReadStats | None = None
) -> Iterator[JobSpec]:
    """Stream the jobs of a Helios `cluster_log.csv`."""
    return _READER.read(path, options, stats)
