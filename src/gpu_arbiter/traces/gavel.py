"""Gavel traces (Narayanan et al., OSDI '20; github.com/stanford-futuredata/gavel).

`.trace` files are tab-separated, one job a line, in the layouts of Gavel and its forks, told
apart by their number of fields:

* 10 (Gavel's current layout, `physical_cluster/*.trace`): job_type, command,
  working_directory, num_steps_arg, needs_data_dir, total_steps, scale_factor,
  priority_weight, SLO, arrival_time;
* 7 (`msr/seed=*/*.trace`, the older layout): job_type, command, num_steps_arg,
  needs_data_dir, total_steps, arrival_time, scale_factor;
* 11 (forks such as Shockwave, NSDI '23): the 10 with `mode` (static, accordion, gns: how
  the job adapts its batch size) after scale_factor;
* 12 (the same forks): the 11 with `duration` (seconds on a V100, the fork's reference)
  before arrival_time.

A job is `gavel-<line>` with `scale_factor` GPUs, submitted at `arrival_time` (seconds). Its
work is `total_steps`; the throughputs Gavel measured are not shipped with the traces, so
`THROUGHPUTS` holds isolated steps/s per job type and GPU (the "null" entries of Gavel's
`scheduler/oracle_throughputs.json`, rounded to 3 figures). Multi-GPU jobs are assumed to
scale linearly. The run time on V100s is the trace's `duration` where it has one, else
`total_steps / (steps/s on V100 * scale_factor)`, which is how Gavel sizes its generated jobs;
where both exist and differ by more than `DURATION_MISMATCH` times, the read warns (a fork
that measured other throughputs, or multi-GPU jobs that do not scale linearly). The job accepts
V100, P100 and K80 (those with a non-zero throughput) at speed 0.35 (the catalog V100) times
its throughput ratio to V100.

Tier from `priority_weight` (Gavel's fair-share weight, 1 by default and in every shipped
trace) through the derived field `priority_class`: weight > 1 → "high" → tier 1, < 1 → "low"
→ tier 3, 1 → "normal", which says nothing and gets a tier from the mix. Teams are hashed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Generator, Iterator, Mapping
from pathlib import Path
from typing import Any

from gpu_arbiter.domain import GPU_CATALOG, Cluster, InvalidInput, JobSpec
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
)
from gpu_arbiter.traces.hardware import K80, P100, pack_cluster

V100 = GPU_CATALOG["V100"]
GAVEL_GPU_TYPES = (V100, P100, K80)
GPUS_PER_NODE = 8
NODES_PER_RACK = 8

# steps/s on one (V100, P100, K80); 0 means the job does not fit on that GPU.
THROUGHPUTS: dict[str, tuple[float, float, float]] = {
    "ResNet-18 (batch size 16)": (77.3, 46.0, 17.9),
    "ResNet-18 (batch size 32)": (65.8, 40.0, 13.4),
    "ResNet-18 (batch size 64)": (48.9, 30.8, 7.75),
    "ResNet-18 (batch size 128)": (30.3, 17.4, 4.66),
    "ResNet-18 (batch size 256)": (17.0, 9.94, 2.51),
    "ResNet-50 (batch size 16)": (17.4, 8.11, 2.70),
    "ResNet-50 (batch size 32)": (9.92, 4.44, 1.47),
    "ResNet-50 (batch size 64)": (5.46, 2.04, 0.773),
    "ResNet-50 (batch size 128)": (2.85, 1.08, 0.0),
    "Transformer (batch size 16)": (12.8, 5.51, 5.51),
    "Transformer (batch size 32)": (12.5, 5.39, 3.84),
    "Transformer (batch size 64)": (9.57, 5.07, 2.02),
    "Transformer (batch size 128)": (5.77, 3.03, 1.04),
    "Transformer (batch size 256)": (1.71, 1.71, 0.515),
    "LM (batch size 5)": (167.0, 122.0, 31.8),
    "LM (batch size 10)": (143.0, 104.0, 29.7),
    "LM (batch size 20)": (108.0, 77.6, 21.8),
    "LM (batch size 40)": (71.7, 42.8, 13.8),
    "LM (batch size 80)": (43.9, 26.4, 7.85),
    "Recommendation (batch size 512)": (0.331, 0.219, 0.207),
    "Recommendation (batch size 1024)": (0.480, 0.297, 0.249),
    "Recommendation (batch size 2048)": (0.568, 0.264, 0.261),
    "Recommendation (batch size 4096)": (0.624, 0.256, 0.240),
    "Recommendation (batch size 8192)": (0.602, 0.277, 0.215),
    "A3C": (8.23, 4.75, 3.83),
    "CycleGAN": (4.92, 2.45, 0.529),
}
# Column positions of each layout, by field count.
_CURRENT = {"job_type": 0, "command": 1, "total_steps": 5, "scale_factor": 6}
_LAYOUTS: dict[int, dict[str, int]] = {
    10: {**_CURRENT, "priority_weight": 7, "SLO": 8, "arrival_time": 9},
    7: {"job_type": 0, "command": 1, "total_steps": 4, "arrival_time": 5, "scale_factor": 6},
    11: {**_CURRENT, "mode": 7, "priority_weight": 8, "SLO": 9, "arrival_time": 10},
    12: {**_CURRENT, "mode": 7, "priority_weight": 8, "SLO": 9, "duration": 10, "arrival_time": 11},
}
_EXPECTED = (
    "expected 10 (Gavel), 7 (msr), 11 or 12 (forks with mode, duration) tab-separated fields"
)
# How far (a ratio either way) a trace's duration and the run time its steps give may differ
# before the read warns.
DURATION_MISMATCH = 2.0
DURATION_WARNING = f"have a duration over {DURATION_MISMATCH:g}x off the run time their steps give"
_BATCH = re.compile(r"^(?P<family>.+?) \(batch size (?P<size>\d+)\)$")
_FIELDS = frozenset(("job_type", "family", "priority_weight", "priority_class", "SLO", "mode"))
PRIORITY_TIERS: Mapping[str, int] = {"high": 1, "low": 3}


def throughput(job_type: str) -> tuple[float, float, float]:
    """Steps/s on (V100, P100, K80) for `job_type`; a batch size the table lacks takes the
    nearest listed size of the same family (by ratio). Unknown families raise `BadField`."""
    if job_type in THROUGHPUTS:
        return THROUGHPUTS[job_type]
    match = _BATCH.match(job_type)
    if match:
        size = int(match["size"])
        listed = [
            (abs(math.log(int(m["size"]) / size)), name)
            for name in THROUGHPUTS
            if (m := _BATCH.match(name)) and m["family"] == match["family"] and size > 0
        ]
        if listed:
            return THROUGHPUTS[min(listed)[1]]
    raise BadField("job_type", f"no throughput known for {job_type!r}")


class GavelReader(TraceReader):
    name = "gavel"
    fields = _FIELDS
    tier_field = "priority_class"
    tier_map = PRIORITY_TIERS

    def records(self, path: Path, report: Reporter, options: TraceOptions) -> RecordPass:
        def read_pass(rep: Reporter) -> Generator[tuple[int, list[str]], None, None]:
            with path.open(encoding="utf-8", errors="replace") as f:
                for row, line in enumerate(f, start=1):
                    if line.strip():
                        yield row, line.rstrip("\r\n").split("\t")

        return read_pass

    def parse(self, row: int, record: Any) -> TraceRecord | Skip:
        layout = _LAYOUTS.get(len(record))
        if layout is None:
            raise BadField("columns", f"{_EXPECTED}, got {len(record)}")
        col = {name: record[i] for name, i in layout.items()}
        job_type, weight = col["job_type"], col.get("priority_weight", "1")
        steps, scale, arrival = col["total_steps"], col["scale_factor"], col["arrival_time"]
        per_gpu = throughput(job_type)
        gpus = as_int(scale, "scale_factor")
        if gpus < 1:
            raise BadField("scale_factor", f"must be >= 1, got {gpus}")
        total_steps = as_float(steps, "total_steps")
        if total_steps < 0:
            raise BadField("total_steps", f"must be >= 0, got {total_steps}")
        if total_steps == 0:
            return Skip("zero_duration")
        submit = as_float(arrival, "arrival_time")
        if submit < 0:
            raise BadField("arrival_time", f"must be >= 0, got {submit}")
        priority = as_float(weight, "priority_weight")
        if priority <= 0:
            raise BadField("priority_weight", f"must be > 0, got {priority}")
        v100 = per_gpu[0]
        from_steps = total_steps / (v100 * gpus)
        run_s, warnings = from_steps, ()
        if "duration" in col:
            run_s = as_float(col["duration"], "duration")
            if not (run_s > 0 and math.isfinite(run_s)):
                raise BadField("duration", f"must be a positive number, got {run_s}")
            if max(run_s / from_steps, from_steps / run_s) > DURATION_MISMATCH:
                warnings = (DURATION_WARNING,)
        speeds = {
            t.name: V100.speed * rate / v100
            for t, rate in zip(GAVEL_GPU_TYPES, per_gpu, strict=True)
            if rate > 0
        }
        match = _BATCH.match(job_type)
        return TraceRecord(
            id=f"gavel-{row}",
            submit_s=submit,
            run_s=run_s,
            gpus=gpus,
            gpu_types=speeds,
            source_speed=V100.speed,
            fields={
                "job_type": job_type,
                "family": match["family"] if match else job_type,
                "priority_weight": weight.strip(),
                "priority_class": "high" if priority > 1 else "low" if priority < 1 else "normal",
                "SLO": col.get("SLO", "-1").strip(),
                "mode": col.get("mode", "static").strip(),
            },
            command=col["command"].strip() or None,
            warnings=warnings,
        )


_READER = GavelReader()


def read_gavel(
    path: str | Path, options: TraceOptions | None = None, stats: ReadStats | None = None
) -> Iterator[JobSpec]:
    """Stream the jobs of a Gavel `.trace` file."""
    return _READER.read(path, options, stats)


def gavel_cluster(spec: str) -> Cluster:
    """A Gavel cluster from its "v100:p100:k80" GPU counts (as in `cluster_specs*.json`).

    Gavel models no topology; we use `GPUS_PER_NODE` (8) GPUs of one type per node (a last,
    smaller node takes a remainder) and `NODES_PER_RACK` (8) nodes of one type per rack,
    named `<type>-r<k>` / `<type>-n<k>`.
    """
    parts = spec.strip().split(":")
    try:
        counts = [int(p) for p in parts]
    except ValueError:
        counts = []
    if len(counts) != 3 or any(c < 0 for c in counts) or not any(counts):
        raise InvalidInput(
            f"gavel cluster spec must be 'v100:p100:k80' GPU counts >= 0, not all 0; got {spec!r}"
        )
    racks: dict[str, list[tuple[str, str, int]]] = {}
    for gpu_type, total in zip(GAVEL_GPU_TYPES, counts, strict=True):
        sizes = [GPUS_PER_NODE] * (total // GPUS_PER_NODE)
        if total % GPUS_PER_NODE:
            sizes.append(total % GPUS_PER_NODE)
        prefix = gpu_type.name.lower()
        for k, gpus in enumerate(sizes):
            rack = f"{prefix}-r{k // NODES_PER_RACK:02d}"
            racks.setdefault(rack, []).append((f"{prefix}-n{k:03d}", gpu_type.name, gpus))
    return pack_cluster(f"gavel-{spec.strip()}", racks, GAVEL_GPU_TYPES)
