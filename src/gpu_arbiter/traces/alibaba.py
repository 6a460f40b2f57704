"""Alibaba cluster-trace-gpu-v2023 (the "openb" traces of Weng et al., ATC '23).

Pods (`openb_pod_list_*.csv`) become jobs; the node list (`openb_node_list_gpu_node.csv`)
becomes the `alibaba-v2023` cluster. Times in the pod lists are seconds.

Mapping of a pod:

* `num_gpu` 0 → skipped as `cpu_only`; `num_gpu` 1 with `gpu_milli` < 1000 → a fractional GPU
  (`gpu_milli` kept); a fraction on more than one GPU is a bad row.
* `gpu_spec` "A|B" → the job accepts only those models, at their speeds below; empty → any.
* duration = `deletion_time` - `scheduled_time` (`creation_time` where the pod was never
  scheduled, as for Pending pods); submit = `creation_time`. Pods still running when the trace
  ended carry the trace end as deletion time, so their durations are cut there.
* tier from `qos`: LS and Guaranteed → 1, Burstable → 2, BE → 3. Team: hashed (no user field).
* run times were measured on the pod's GPU: with a `gpu_spec`, the mean speed of the accepted
  models; without one, `ALIBABA_SOURCE_SPEED` (V100-class, the class of 82% of the cluster's
  GPUs under the assumption below).

A pod list without times (the sampled `openb_pod_list_multigpu*.csv`: only `name`, `cpu_milli`,
`memory_mib`, `num_gpu`, `gpu_milli`, made for a simulator that needs none) takes them from
`openb_pod_list_default.csv` beside it, which it was sampled from:

* a pod named in the default list with the same resources (`cpu_milli`, `memory_mib`,
  `num_gpu`, `gpu_milli`) takes that pod's `qos`, `pod_phase` and creation, scheduling and
  deletion times;
* any other pod (the lists add multi-GPU pods under new names) takes them all from one pod of
  the default list with the same `num_gpu`, drawn by a hash of the run's seed and its name, so
  submit time, duration and QoS follow their empirical joint distribution for that GPU count
  and the list keeps its added multi-GPU load. Only default pods that are jobs themselves
  (positive duration) are drawn.

The read summary counts the jobs of each kind (`ReadStats.times`). Without a default list
beside it, such a list is refused, naming the missing columns and the missing file.
"""

from __future__ import annotations

import csv
from collections.abc import Generator, Iterator, Mapping
from pathlib import Path
from typing import Any

from gpu_arbiter.domain import MILLI, Cluster, GpuType, InvalidInput, JobSpec
from gpu_arbiter.traces.base import (
    BadField,
    ReadStats,
    RecordPass,
    Reporter,
    Skip,
    TraceOptions,
    TraceReader,
    TraceRecord,
    as_int,
    check_columns,
    csv_rows,
    gpu_count,
    unit_hash,
)
from gpu_arbiter.traces.hardware import A10, P100, T4, V100M16, V100M32, pack_cluster

# G1, G2 and G3 are undisclosed internal models (trace README). Assumption: V100-class
# (speed 0.35, 300 W, 32 GiB) - they sit in 8-GPU training nodes next to the V100 fleet; pass
# other figures to `alibaba_cluster` where better ones are known.
ALIBABA_GPU_TYPES: dict[str, GpuType] = {
    t.name: t
    for t in (
        P100,
        T4,
        A10,
        V100M16,
        V100M32,
        GpuType("G1", speed=0.35, power_w=300, memory_gib=32),
        GpuType("G2", speed=0.35, power_w=300, memory_gib=32),
        GpuType("G3", speed=0.35, power_w=300, memory_gib=32),
    )
}
ALIBABA_SOURCE_SPEED = 0.35
NODES_PER_RACK = 16
QOS_TIERS: Mapping[str, int] = {"LS": 1, "Guaranteed": 1, "Burstable": 2, "BE": 3}

DEFAULT_POD_LIST = "openb_pod_list_default.csv"

_REQUIRED = ("name", "num_gpu", "gpu_milli", "qos", "creation_time", "deletion_time")
_FIELDS = frozenset(
    (*_REQUIRED, "cpu_milli", "memory_mib", "gpu_spec", "pod_phase", "scheduled_time")
)
# A pod list without times has these columns; they must match a default pod's to take its times.
_RESOURCES = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
_TIMES = ("qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time")


class AlibabaReader(TraceReader):
    name = "alibaba-v2023"
    fields = _FIELDS
    tier_field = "qos"
    tier_map = QOS_TIERS

    def locate(self, path: Path) -> Path:
        """Also refuses, before any job is read, a list whose times are nowhere to be found."""
        located = super().locate(path)
        times_source(located)
        return located

    def records(self, path: Path, report: Reporter, options: TraceOptions) -> RecordPass:
        default = times_source(path)
        times = None
        if default is not None:
            side = Reporter(str(default), report.stats, report.strict, "default.")
            times = _DefaultTimes(default, side, options.seed)

        def read_pass(rep: Reporter) -> Generator[tuple[int, Any], None, None]:
            for row, pod in csv_rows(path, rep, _REQUIRED if times is None else _RESOURCES):
                yield row, (pod, times)

        return read_pass

    def parse(self, row: int, record: Any) -> TraceRecord | Skip:
        pod, times = record
        num_gpu = gpu_count(pod, "num_gpu")
        if isinstance(num_gpu, Skip):
            return num_gpu
        if times is None:
            return _job(pod, num_gpu)
        timed, times_from = times.fill(pod, num_gpu)
        return _job(timed, num_gpu, times_from)


def times_source(path: Path) -> Path | None:
    """The default pod list that the pod list at `path` takes its times from (module
    docstring), or None where it has its own. A list without times and without a default list
    beside it is refused here, naming the columns and the file it lacks."""
    with path.open(newline="", encoding="utf-8", errors="replace") as f:
        header = [c.strip() for c in next(csv.reader(f), [])]
    lacking = [c for c in _REQUIRED if c not in header]
    if not lacking or any(c not in header for c in _RESOURCES):
        return None  # its own times, or not a pod list at all (`csv_rows` says which columns)
    default = path.parent / DEFAULT_POD_LIST
    if default.resolve() == path.resolve() or not default.is_file():
        raise InvalidInput(
            f"{path}: missing columns {', '.join(lacking)}, and no {default} beside it to take "
            "them from"
        )
    return default


class _DefaultTimes:
    """The pods of the default list, by name and (those that are jobs) by GPU count."""

    def __init__(self, path: Path, report: Reporter, seed: int) -> None:
        self.seed = seed
        self.taken = f"taken by name from {path.name}"
        self.drawn = f"drawn by GPU count from {path.name}"
        self.by_name: dict[str, dict[str, str]] = {}
        self.by_gpus: dict[int, list[dict[str, str]]] = {}
        for _, pod in csv_rows(path, report, _REQUIRED):
            self.by_name.setdefault(pod["name"].strip(), pod)
            try:
                gpus = gpu_count(pod, "num_gpu")
                job = gpus if isinstance(gpus, Skip) else _job(pod, gpus)
            except BadField:
                continue  # only a pod named by the list reports it, as its own bad row
            if isinstance(job, TraceRecord):
                self.by_gpus.setdefault(job.gpus, []).append(pod)

    def fill(self, pod: dict[str, str], gpus: int) -> tuple[dict[str, str], str]:
        """The pod with its times, and where they came from."""
        name = pod["name"].strip()
        if not name:
            raise BadField("name", "missing")
        same = self.by_name.get(name)
        if same is not None and all(same[c].strip() == pod[c].strip() for c in _RESOURCES):
            return {**pod, **{c: same.get(c, "") for c in _TIMES}}, self.taken
        pool = self.by_gpus.get(gpus)
        if not pool:
            raise BadField("num_gpu", f"no pod of the default list with {gpus} GPU(s) to draw from")
        drawn = pool[int(unit_hash(self.seed, "alibaba-times", name) * len(pool))]
        return {**pod, **{c: drawn.get(c, "") for c in _TIMES}}, self.drawn


def _job(record: dict[str, str], num_gpu: int, times_from: str | None = None) -> TraceRecord | Skip:
    """One GPU pod with its times as a job (module docstring)."""
    milli = as_int(record["gpu_milli"], "gpu_milli")
    if not 0 < milli <= MILLI or (milli < MILLI and num_gpu > 1):
        raise BadField("gpu_milli", f"{milli} is not a GPU share for {num_gpu} GPU(s)")
    accepted = _gpu_spec(record.get("gpu_spec", ""))
    created = as_int(record["creation_time"], "creation_time")
    scheduled = record.get("scheduled_time", "")
    start = as_int(scheduled, "scheduled_time") if scheduled.strip() else created
    run_s = as_int(record["deletion_time"], "deletion_time") - start
    if run_s < 0:
        raise BadField("deletion_time", f"before the pod started ({start})")
    if run_s == 0:
        return Skip("zero_duration")
    if not record["name"]:
        raise BadField("name", "missing")
    speeds = {name: ALIBABA_GPU_TYPES[name].speed for name in accepted}
    return TraceRecord(
        id=record["name"],
        submit_s=created,
        run_s=run_s,
        gpus=num_gpu,
        gpu_milli=milli,
        gpu_types=speeds,
        source_speed=sum(speeds.values()) / len(speeds) if speeds else ALIBABA_SOURCE_SPEED,
        fields=record,
        times_from=times_from,
    )


def _gpu_spec(raw: str) -> list[str]:
    """Accepted models from "A|B" (the trace repeats some, e.g. "V100M16|V100M32|V100M32")."""
    names = list(dict.fromkeys(p.strip() for p in raw.split("|") if p.strip()))
    unknown = [n for n in names if n not in ALIBABA_GPU_TYPES]
    if unknown:
        raise BadField("gpu_spec", f"unknown GPU model(s) {', '.join(unknown)}")
    return names


_READER = AlibabaReader()


def read_alibaba(
    path: str | Path, options: TraceOptions | None = None, stats: ReadStats | None = None
) -> Iterator[JobSpec]:
    """Stream the jobs of an openb pod list; see the module docstring for the mapping."""
    return _READER.read(path, options, stats)


def alibaba_cluster(
    node_list_csv: str | Path,
    gpu_types: Mapping[str, GpuType] | None = None,
    fraction: float = 1.0,
) -> Cluster:
    """The real openb GPU cluster from its node list (`openb_node_list_gpu_node.csv`).

    One node per GPU row (rows with no GPU, as in `..._all_node.csv`, are left out), named by
    `sn`. The trace has no racks, so nodes are grouped deterministically: by model in order of
    first appearance, file order within a model, `NODES_PER_RACK` (16) consecutive nodes of one
    model per rack (`<model>-r<k>`). `gpu_types` overrides the speeds and powers of
    `ALIBABA_GPU_TYPES`.

    `fraction` < 1 keeps that share of each model's nodes (the first in file order, at least
    one per model): the same mix of GPU types at a smaller size, to replay the trace at a
    realistic load (named `alibaba-v2023@<fraction>`).
    """
    if not 0 < fraction <= 1:
        raise InvalidInput(f"alibaba-v2023 cluster: fraction must be in (0, 1], got {fraction}")
    path = Path(node_list_csv)
    if not path.is_file():
        raise InvalidInput(f"alibaba-v2023 node list: file not found: {path}")
    types = dict(ALIBABA_GPU_TYPES)
    types.update(gpu_types or {})
    by_model: dict[str, list[tuple[str, str, int]]] = {}
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        check_columns(path, reader.fieldnames or [], ("sn", "gpu", "model"))
        for rec in reader:
            where = f"{path}: row {reader.line_num}"
            try:
                gpus = int(rec["gpu"])
            except (TypeError, ValueError):
                raise InvalidInput(f"{where}: gpu: not an integer: {rec['gpu']!r}") from None
            if gpus == 0:
                continue
            model = (rec["model"] or "").strip()
            if model not in types:
                raise InvalidInput(f"{where}: model: unknown GPU model {model!r}")
            by_model.setdefault(model, []).append((rec["sn"], model, gpus))
    racks: dict[str, list[tuple[str, str, int]]] = {}
    for model, nodes in by_model.items():
        if fraction < 1:
            nodes = nodes[: max(1, round(len(nodes) * fraction))]
        for k in range(0, len(nodes), NODES_PER_RACK):
            racks[f"{model}-r{k // NODES_PER_RACK:02d}"] = nodes[k : k + NODES_PER_RACK]
    name = "alibaba-v2023" if fraction == 1 else f"alibaba-v2023@{fraction:g}"
    return pack_cluster(name, racks, types.values())
