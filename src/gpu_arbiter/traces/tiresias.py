"""Tiresias simulator traces (Gu et al., NSDI '19; github.com/SymbioticLab/Tiresias).

Job files (`60_job.csv`, ...) have `job_id,num_gpu,submit_time,iterations,model_name,duration,
interval`; times are seconds. A job becomes `tiresias-<job_id>` with `num_gpu` GPUs, submitted
at `submit_time` and running `duration` seconds. The trace names no users, teams or priorities,
so teams are hashed and tiers drawn from the tier mix (`model_name` may be used as a field).

Cluster files (`n32g4.csv`, ...) have `num_switch,num_node_p_switch,num_gpu_p_node,...`.

GPU type: the trace does not say. We assume P100 (`TIRESIAS_GPU`): the Tiresias testbed and
the Philly cluster its job mix comes from are Pascal-era, so run times are taken as measured
on P100s.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpu_arbiter.domain import Cluster, GpuType, InvalidInput, JobSpec
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
    check_columns,
    csv_rows,
    gpu_count,
    required_id,
)
from gpu_arbiter.traces.hardware import P100, pack_cluster

TIRESIAS_GPU = P100
_REQUIRED = ("job_id", "num_gpu", "submit_time", "duration")
_FIELDS = frozenset((*_REQUIRED, "iterations", "model_name", "interval"))


class TiresiasReader(TraceReader):
    name = "tiresias"
    fields = _FIELDS

    def records(self, path: Path, report: Reporter, options: TraceOptions) -> RecordPass:
        return lambda rep: csv_rows(path, rep, _REQUIRED)

    def parse(self, row: int, record: Any) -> TraceRecord | Skip:
        job_id = required_id(record, "job_id")
        gpus = gpu_count(record, "num_gpu")
        if isinstance(gpus, Skip):
            return gpus
        submit = as_float(record["submit_time"], "submit_time")
        if submit < 0:
            raise BadField("submit_time", f"must be >= 0, got {submit}")
        duration = as_float(record["duration"], "duration")
        if duration < 0:
            raise BadField("duration", f"must be >= 0, got {duration}")
        if duration == 0:
            return Skip("zero_duration")
        return TraceRecord(
            id=f"tiresias-{job_id}",
            submit_s=submit,
            run_s=duration,
            gpus=gpus,
            source_speed=TIRESIAS_GPU.speed,
            fields=record,
        )


_READER = TiresiasReader()


def read_tiresias(
    path: str | Path, options: TraceOptions | None = None, stats: ReadStats | None = None
) -> Iterator[JobSpec]:
    """Stream the jobs of a Tiresias job CSV."""
    return _READER.read(path, options, stats)


def tiresias_cluster(spec_csv: str | Path, gpu_type: GpuType = TIRESIAS_GPU) -> Cluster:
    """The cluster of a Tiresias spec file: one rack per switch, `num_node_p_switch` nodes of
    `num_gpu_p_node` GPUs in each (`switch<s>-n<k>`); CPU and memory columns are ignored."""
    path = Path(spec_csv)
    if not path.is_file():
        raise InvalidInput(f"tiresias cluster spec: file not found: {path}")
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        columns = ("num_switch", "num_node_p_switch", "num_gpu_p_node")
        check_columns(path, reader.fieldnames or [], columns)
        spec = next(reader, None)
        if spec is None:
            raise InvalidInput(f"{path}: no cluster row after the header")
        counts: list[int] = []
        for column in columns:
            try:
                counts.append(int(spec[column]))
            except (TypeError, ValueError):
                raise InvalidInput(f"{path}: row 2: {column}: not an integer") from None
    switches, per_switch, gpus = counts
    if switches < 1 or per_switch < 1 or gpus < 1:
        raise InvalidInput(f"{path}: row 2: switches, nodes and GPUs must all be >= 1")
    racks = {
        f"switch{s}": [(f"switch{s}-n{k:02d}", gpu_type.name, gpus) for k in range(per_switch)]
        for s in range(switches)
    }
    return pack_cluster(f"tiresias-{path.stem}", racks, [gpu_type])
