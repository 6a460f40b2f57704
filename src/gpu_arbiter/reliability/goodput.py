"""F4 and F3 accounting: goodput next to utilisation, and mean time to repair.

Goodput counts GPU time that produced progress the job kept. A job *holds* GPU-seconds while it
runs; when a run segment ends, the GPU time behind the progress it kept is *useful* and the GPU
time behind progress a failure threw away is *lost*. What is neither is overhead (restoring a
checkpoint) or not settled yet (a segment still running). Useful plus lost never exceeds held,
so goodput never exceeds utilisation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpu_arbiter.domain import InvalidInput
from gpu_arbiter.reliability.checkpoint import LostWork, RunSegment

_ROUNDING = 1e-9  # relative slack for float sums when checking useful + lost <= held


@dataclass(frozen=True, slots=True)
class GoodputTotals:
    """GPU-seconds held, useful and lost (by one job or by all)."""

    held_gpu_s: float = 0.0
    useful_gpu_s: float = 0.0
    lost_gpu_s: float = 0.0

    @property
    def other_gpu_s(self) -> float:
        """Held time neither useful nor lost: checkpoint restores and unsettled segments."""
        return self.held_gpu_s - self.useful_gpu_s - self.lost_gpu_s

    @property
    def ratio(self) -> float:
        """Share of held GPU time that was useful; 0 when nothing was held."""
        return self.useful_gpu_s / self.held_gpu_s if self.held_gpu_s else 0.0

    def utilisation(self, capacity_gpu_s: float) -> float:
        """Held GPU time over the cluster's GPU time in the same period."""
        return self.held_gpu_s / _capacity(capacity_gpu_s)

    def goodput(self, capacity_gpu_s: float) -> float:
        """Useful GPU time over the cluster's GPU time in the same period."""
        return self.useful_gpu_s / _capacity(capacity_gpu_s)


class GoodputLedger:
    """Per-job and total held, useful and lost GPU-seconds, kept up to date as records arrive.

    Record holding as time passes (`hold`) and settle segments as they end (`settle`), or do
    both at once with `close`. Settling more than was held is a driver bug and is refused.
    """

    def __init__(self) -> None:
        self._jobs: dict[str, GoodputTotals] = {}
        self._total = GoodputTotals()

    def hold(self, job_id: str, gpu_s: float) -> None:
        """`job_id` held `gpu_s` more GPU-seconds."""
        self._add(job_id, _amount(job_id, gpu_s), 0.0, 0.0)

    def settle(self, job_id: str, useful_gpu_s: float, lost_gpu_s: float) -> None:
        """Of what `job_id` held, `useful_gpu_s` produced kept progress and `lost_gpu_s`
        progress that was thrown away."""
        self._add(job_id, 0.0, _amount(job_id, useful_gpu_s), _amount(job_id, lost_gpu_s))

    def close(
        self, job_id: str, gpus: int, segment: RunSegment, ended_at: float, saved: bool = False
    ) -> LostWork:
        """End `segment` of `job_id` on `gpus` GPUs at `ended_at` (see `RunSegment.lost_work`),
        record its whole holding and settle it; returns the outcome (resume from `kept_s`)."""
        outcome = segment.lost_work(ended_at, saved)
        self.hold(job_id, gpus * (ended_at - segment.started_at))
        self.settle(job_id, gpus * outcome.useful_wall_s, gpus * outcome.lost_wall_s)
        return outcome

    def job(self, job_id: str) -> GoodputTotals:
        return self._jobs.get(job_id, GoodputTotals())

    @property
    def totals(self) -> GoodputTotals:
        return self._total

    def _add(self, job_id: str, held: float, useful: float, lost: float) -> None:
        job = self.job(job_id)
        settled = job.useful_gpu_s + useful + job.lost_gpu_s + lost
        limit = job.held_gpu_s + held
        if settled > limit * (1 + _ROUNDING) + _ROUNDING:
            raise InvalidInput(
                f"goodput: job {job_id!r} would settle {settled:g} GPU-s but held only {limit:g}"
            )
        self._jobs[job_id] = _clamped(job, held, useful, lost)
        self._total = _clamped(self._total, held, useful, lost)


def _clamped(t: GoodputTotals, held: float, useful: float, lost: float) -> GoodputTotals:
    """`t` plus the amounts, with useful and lost trimmed so they never exceed held (the trim
    only ever absorbs float rounding; real excess is refused before)."""
    held_total = t.held_gpu_s + held
    useful_total = min(t.useful_gpu_s + useful, held_total)
    lost_total = min(t.lost_gpu_s + lost, held_total - useful_total)
    return GoodputTotals(held_total, useful_total, lost_total)


class MttrTracker:
    """Time from a fault to recovery, per key: a node name (fault → repaired) or a job id
    (fault → restarted). A second fault on a key that is still down keeps the first time:
    the outage began then."""

    def __init__(self) -> None:
        self._open: dict[str, float] = {}
        self._durations: list[float] = []

    def fault(self, key: str, at: float) -> None:
        self._open.setdefault(key, at)

    def recovered(self, key: str, at: float) -> float | None:
        """Close `key`'s outage at `at` and return its length; None if `key` was not down."""
        began = self._open.get(key)
        if began is None:
            return None
        if at < began:
            raise InvalidInput(f"mttr: {key!r} recovered at {at} before its fault at {began}")
        del self._open[key]
        self._durations.append(at - began)
        return at - began

    @property
    def down(self) -> frozenset[str]:
        """Keys with an outage not yet recovered."""
        return frozenset(self._open)

    @property
    def durations(self) -> tuple[float, ...]:
        """Lengths of recovered outages, in the order they ended (for percentiles)."""
        return tuple(self._durations)

    @property
    def count(self) -> int:
        return len(self._durations)

    @property
    def mttr_s(self) -> float | None:
        """Mean time to repair; None before the first recovery."""
        return sum(self._durations) / len(self._durations) if self._durations else None


def _amount(job_id: str, gpu_s: float) -> float:
    if not (gpu_s >= 0 and math.isfinite(gpu_s)):
        raise InvalidInput(f"goodput: job {job_id!r}: GPU-seconds must be >= 0, got {gpu_s}")
    return gpu_s


def _capacity(capacity_gpu_s: float) -> float:
    if not capacity_gpu_s > 0:
        raise InvalidInput(f"goodput: capacity_gpu_s must be > 0, got {capacity_gpu_s}")
    return capacity_gpu_s
