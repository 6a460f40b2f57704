"""Job-level KPIs: completion time, queueing delay, utilisation, goodput, preemption, SLA."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from gpu_arbiter.domain import Job, JobState

# Queueing-delay targets per tier used for SLA attainment: tier 1 within 5 minutes,
# tier 2 within 1 hour, tier 3 within a day.
SLA_QUEUE_S = {1: 300.0, 2: 3600.0, 3: 86400.0}


@dataclass(frozen=True, slots=True)
class JobRecord:
    id: str
    team: str
    tier: int  # the tier asked for
    gpus: int
    submit_s: float
    first_start: float | None
    finished_at: float | None
    completed: bool
    busy_gpu_s: float
    useful_gpu_s: float
    lost_gpu_s: float
    preemptions: int
    restarts: int
    gpu_type: str | None = None

    @classmethod
    def of(cls, job: Job, gpu_type: str | None = None) -> JobRecord:
        return cls(
            id=job.id,
            team=job.team,
            tier=int(job.spec.tier),
            gpus=job.spec.gpus,
            submit_s=job.spec.submit_s,
            first_start=job.first_start,
            finished_at=job.finished_at,
            completed=job.state == JobState.COMPLETED,
            busy_gpu_s=job.busy_gpu_s,
            useful_gpu_s=job.useful_gpu_s,
            lost_gpu_s=job.lost_gpu_s,
            preemptions=job.preemptions,
            restarts=job.restarts,
            gpu_type=gpu_type,
        )

    @property
    def jct_s(self) -> float | None:
        return self.finished_at - self.submit_s if self.completed else None

    @property
    def queue_delay_s(self) -> float | None:
        return self.first_start - self.submit_s if self.first_start is not None else None


def show_duration(seconds: float) -> str:
    """A KPI time as every report shows it: seconds under two minutes, minutes under two
    hours, hours beyond."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def percentile(values: Iterable[float], q: float) -> float:
    arr = np.fromiter(values, dtype=float)
    return float(np.percentile(arr, q)) if arr.size else 0.0


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "mean": float(np.mean(values)) if values else 0.0,
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
    }


def compute_kpis(
    records: list[JobRecord],
    total_gpus: int,
    start_s: float,
    end_s: float,
    tier1_preempted: int,
    time_averages: Mapping[str, float] | None = None,
) -> dict:
    """KPIs over a run from `start_s` to `end_s` on `total_gpus` GPUs.

    Utilisation is GPU time held over GPU time available; goodput is GPU time whose progress
    was kept over the same denominator, so goodput <= utilisation always.
    """
    span = max(end_s - start_s, 1e-9)
    capacity = total_gpus * span
    done = [r for r in records if r.completed]
    jct = [r.jct_s for r in done]
    by_tier: dict[str, dict] = {}
    delay_p99: dict[str, float] = {}
    delay_p50: dict[str, float] = {}
    sla_met = sla_total = 0
    for tier in (1, 2, 3):
        tier_recs = [r for r in records if r.tier == tier]
        delays = [r.queue_delay_s for r in tier_recs if r.queue_delay_s is not None]
        by_tier[str(tier)] = {
            "jobs": len(tier_recs),
            "completed": sum(r.completed for r in tier_recs),
            **{
                f"{k}_jct_s": v
                for k, v in _stats([r.jct_s for r in tier_recs if r.completed]).items()
            },
        }
        delay_p99[str(tier)] = percentile(delays, 99)
        delay_p50[str(tier)] = percentile(delays, 50)
        sla_total += len(tier_recs)
        sla_met += sum(
            1
            for r in tier_recs
            if r.queue_delay_s is not None and r.queue_delay_s <= SLA_QUEUE_S[tier]
        )
    busy = sum(r.busy_gpu_s for r in records)
    useful = sum(r.useful_gpu_s for r in records)
    preemptions = sum(r.preemptions for r in records)
    out = {
        "jobs": len(records),
        "completed": len(done),
        "avg_jct_s": float(np.mean(jct)) if jct else 0.0,
        "p50_jct_s": percentile(jct, 50),
        "p99_jct_s": percentile(jct, 99),
        "jct_by_tier": by_tier,
        "p50_queue_delay_s_by_tier": delay_p50,
        "p99_queue_delay_s_by_tier": delay_p99,
        "utilization": busy / capacity,
        "goodput": useful / capacity,
        "useful_gpu_hours": useful / 3600,
        "busy_gpu_hours": busy / 3600,
        "lost_gpu_hours": sum(r.lost_gpu_s for r in records) / 3600,
        "preemptions": preemptions,
        "preemption_rate": preemptions / len(records) if records else 0.0,
        "tier1_preempted": tier1_preempted,
        "sla_attainment": sla_met / sla_total if sla_total else 1.0,
        "makespan_s": span,
    }
    out.update(time_averages or {})
    return out
