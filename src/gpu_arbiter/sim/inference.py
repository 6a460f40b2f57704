"""S9 in the simulator: how fast an inference surge gets its GPUs.

The engine releases offline work for an inference job inside the cycle that decides it (the
victims get no grace), and the simulated backend stops a job instantly, so the
decision-to-release latency is the wall time of that engine cycle. It is measured, not
simulated: the only KPI of a run that depends on the machine it ran on.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpu_arbiter.domain import Decision, Job, JobKind, Preempt
from gpu_arbiter.metrics.kpis import percentile


class InferenceStats:
    __slots__ = ("release_ms", "preemptions")

    def __init__(self) -> None:
        self.release_ms: list[float] = []  # wall time of each cycle that preempted for inference
        self.preemptions = 0

    def cycle(self, decisions: Iterable[Decision], jobs: dict[str, Job], wall_ms: float) -> None:
        """Record one engine cycle that took `wall_ms` and decided `decisions`."""
        n = sum(
            1
            for d in decisions
            if isinstance(d, Preempt)
            and d.for_job is not None
            and jobs[d.for_job].spec.kind == JobKind.INFERENCE
        )
        if n:
            self.preemptions += n
            self.release_ms.append(wall_ms)

    def kpis(self, jobs: Iterable[Job]) -> dict:
        served = [j for j in jobs if j.spec.kind == JobKind.INFERENCE]
        delays = [j.first_start - j.spec.submit_s for j in served if j.first_start is not None]
        return {
            "inference_jobs": len(served),
            "inference_preemptions": self.preemptions,
            "inference_p99_queue_delay_s": percentile(delays, 99),
            "inference_release_p99_ms": percentile(self.release_ms, 99),
        }
