"""The cluster's own history (`arbiter history export`), format `arbiter`: docs/history-format.md.

Line 1 is a header (format "arbiter-history", version 1) with the cluster, teams and prices in
force; every other line is one job. Mapping of a job:

* team: `team`; tier: `tier_requested` (the engine decides the tier given, as it did live).
* run time: the work the job kept, in H100 (reference) seconds: over its run segments, the
  segment's length less the seconds a failure lost (`lost_s`), times the speed of the GPU
  type it ran on (the job's own speed for that type, else the header's). So a replay on the
  same cluster runs each job as long as it really ran.
* a job that never ran (cancelled while waiting) is skipped as `never_ran`; one still waiting
  or running when the history was taken as `unfinished`. Failed and cancelled jobs that ran
  are replayed for what they ran: they held GPUs and made others wait.
* walltime estimate and checkpoint interval: the user's own; accepted GPU types and speeds.

`history_cluster` and `history_teams` rebuild the cluster and teams of the header;
`real_queueing` is what the jobs really waited, to compare a replay with.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_arbiter.domain import Cluster, InvalidInput, Team
from gpu_arbiter.domain.cluster import GPU_CATALOG
from gpu_arbiter.domain.presets import cluster_from_dict
from gpu_arbiter.traces.base import (
    BadField,
    ReadStats,
    RecordPass,
    Reporter,
    Skip,
    TraceOptions,
    TraceReader,
    TraceRecord,
)

FORMAT = "arbiter-history"
VERSIONS = (1,)
ENDED = ("completed", "failed", "cancelled")


def read_header(path: str | Path) -> dict[str, Any]:
    """The header of a history file, checked: format name, a version this reader knows, and
    the cluster and teams it must carry."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"arbiter history: file not found: {path}")
    with path.open(encoding="utf-8", errors="replace") as f:
        first = f.readline()
    try:
        header = json.loads(first)
    except ValueError:
        raise InvalidInput(f"{path}: line 1: not a JSON header line") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise InvalidInput(f"{path}: line 1: not an {FORMAT} file (format field)")
    if header.get("version") not in VERSIONS:
        raise InvalidInput(
            f"{path}: line 1: {FORMAT} version {header.get('version')!r} is not one this "
            f"reader knows ({', '.join(map(str, VERSIONS))})"
        )
    for key in ("cluster", "teams"):
        if key not in header:
            raise InvalidInput(f"{path}: line 1: header has no {key!r}")
    return header


def history_cluster(path: str | Path) -> Cluster:
    """The cluster the history ran on (every node it had when it was taken)."""
    return cluster_from_dict(read_header(path)["cluster"], source=f"{path}: header.cluster")


def history_teams(path: str | Path, cluster: Cluster) -> list[Team]:
    """The teams in force (weights, quotas, budgets), fitted to `cluster` so the same teams
    can be replayed on another one: a quota on a GPU type it lacks is dropped, and where the
    quotas promise more GPUs of a type than it has, each is cut in the same proportion."""
    have = cluster.gpus_by_type()
    rows = []
    for t in read_header(path)["teams"]:
        try:
            quota = {k: int(v) for k, v in (t.get("quota") or {}).items() if k in have}
            rows.append((str(t["name"]), float(t.get("weight", 1.0)), quota, t.get("budget")))
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidInput(f"{path}: header.teams: bad team {t!r} ({e})") from None
    promised: dict[str, int] = {}
    for _, _, quota, _ in rows:
        for k, v in quota.items():
            promised[k] = promised.get(k, 0) + v
    scale = {k: min(1.0, have[k] / n) for k, n in promised.items() if n}
    return [
        Team(name, weight, {k: math.floor(v * scale.get(k, 1.0)) for k, v in quota.items()}, budget)
        for name, weight, quota, budget in rows
    ]


@dataclass(frozen=True, slots=True)
class RealWait:
    """What one replayed job really waited before it first started."""

    id: str
    team: str
    tier: int
    queue_delay_s: float


def real_queueing(path: str | Path, options: TraceOptions | None = None) -> list[RealWait]:
    """The real queueing delays of the jobs a replay of `path` runs (same rows, same skips)."""
    reader = ArbiterHistoryReader()
    ids = {spec.id for spec in reader.read(path, options)}
    out = []
    for _, (job, _speeds) in _lines(
        Path(path), Reporter(str(path), ReadStats(source=str(path)), False)
    ):
        if isinstance(job, dict) and job.get("id") in ids and job.get("first_start") is not None:
            out.append(
                RealWait(
                    job["id"],
                    job["team"],
                    int(job["tier_requested"]),
                    float(job["first_start"]) - float(job["submitted_at"]),
                )
            )
    return out


def _lines(path: Path, report: Reporter) -> Iterator[tuple[int, tuple[Any, Mapping[str, float]]]]:
    header = read_header(path)
    speeds = {t["name"]: float(t["speed"]) for t in header["cluster"].get("gpu_types", [])}
    with path.open(encoding="utf-8", errors="replace") as f:
        next(f)
        for row, line in enumerate(f, start=2):
            if not line.strip():
                continue
            try:
                yield row, (json.loads(line), speeds)
            except ValueError as e:
                report.bad(row, "json", f"not a JSON line ({e.msg})")


class ArbiterHistoryReader(TraceReader):
    name = "arbiter"
    fields = frozenset(("team", "tier_requested", "tier_given", "state", "name"))
    team_field = "team"
    tier_field = "tier_requested"
    tier_map = {"1": 1, "2": 2, "3": 3}

    def locate(self, path: Path) -> Path:
        read_header(path)  # a wrong file fails at once, not as every line bad
        return path

    def records(self, path: Path, report: Reporter, options: TraceOptions) -> RecordPass:
        return lambda rep: _lines(path, rep)

    def parse(self, row: int, record: Any) -> TraceRecord | Skip:
        job, speeds = record
        if not isinstance(job, dict):
            raise BadField("line", "not a JSON object")
        for key in ("id", "team", "tier_requested", "gpus", "submitted_at", "state"):
            if job.get(key) in (None, ""):
                raise BadField(key, "missing")
        if job["state"] not in ENDED:
            return Skip("unfinished")
        segments = job.get("segments") or []
        accepted = _speeds(job.get("gpu_types"))
        kept = 0.0
        for k, seg in enumerate(segments):
            try:
                length = float(seg["end"]) - float(seg["start"]) - float(seg.get("lost_s") or 0)
                gpu_type = seg.get("gpu_type")
                speed = accepted.get(gpu_type) or speeds.get(gpu_type) or _catalog(gpu_type)
            except (KeyError, TypeError, ValueError):
                raise BadField(f"segments[{k}]", "needs start, end and lost_s numbers") from None
            kept += max(length, 0.0) * speed
        if not segments:
            return Skip("never_ran")
        if not kept > 0:
            return Skip("zero_duration")
        gpus = _number(job, "gpus")
        if gpus < 1 or gpus != int(gpus):
            raise BadField("gpus", f"must be a whole number >= 1, got {job['gpus']!r}")
        walltime = job.get("walltime_s")
        interval = job.get("checkpoint_interval_s")
        return TraceRecord(
            id=str(job["id"]),
            submit_s=_number(job, "submitted_at"),
            run_s=kept,
            gpus=int(gpus),
            source_speed=1.0,  # `kept` is already in reference seconds
            fields={k: str(job.get(k, "")) for k in self.fields},
            gpu_milli=int(job.get("gpu_milli") or 1000),
            gpu_types=accepted,
            walltime_s=None if walltime is None else _number(job, "walltime_s"),
            checkpoint_interval_s=None
            if interval is None
            else _number(job, "checkpoint_interval_s"),
        )


def _number(job: Mapping[str, Any], key: str) -> float:
    try:
        value = float(job[key])
    except (TypeError, ValueError):
        raise BadField(key, f"not a number: {job[key]!r}") from None
    if not math.isfinite(value):
        raise BadField(key, f"not a finite number: {job[key]!r}")
    return value


def _speeds(raw: Any) -> dict[str, float]:
    if raw in (None, {}):
        return {}
    if not isinstance(raw, dict):
        raise BadField("gpu_types", "expected {type: speed}")
    try:
        return {str(k): float(v) for k, v in raw.items()}
    except (TypeError, ValueError):
        raise BadField("gpu_types", "speeds must be numbers") from None


def _catalog(gpu_type: str | None) -> float:
    if gpu_type in GPU_CATALOG:
        return GPU_CATALOG[gpu_type].speed
    raise BadField("segments", f"unknown GPU type {gpu_type!r} and no speed for it")
