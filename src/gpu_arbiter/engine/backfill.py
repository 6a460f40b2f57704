"""Reservation-based (EASY) backfill (S6).

When the highest-priority job that wants a GPU type cannot start, it gets a reservation: the
earliest time (the *shadow time*) at which, by the running jobs' walltime estimates, enough GPUs
of that type will be free, and the *extra* GPUs that will be free then beyond its need. A later,
lower-priority job may start now only if it will end before the shadow time, or if it fits in
the extra GPUs — so it can never delay the reserved start.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from gpu_arbiter.domain import Job


@dataclass(slots=True)
class Reservation:
    job_id: str
    gpu_type: str
    gpus: int
    shadow_time: float
    extra: int

    def copy(self) -> Reservation:
        """A copy to book on (`fits_before` takes from `extra`): a cycle copies every kept
        reservation, so this spells the fields out (`dataclasses.replace` is 5x slower)."""
        return Reservation(self.job_id, self.gpu_type, self.gpus, self.shadow_time, self.extra)


def reserve(
    job: Job, gpu_type: str, gpus: int, free: int, ends: Iterable[tuple[float, int]], now: float
) -> Reservation:
    """`ends` is (expected end, GPUs held) of the running jobs of the type, earliest first. The
    shadow time is infinite when even all of them ending would not free enough GPUs."""
    shadow, available = expected_free_at(gpus, free, ends, now)
    return Reservation(job.id, gpu_type, gpus, shadow, max(0, available - gpus))


def expected_free_at(
    gpus: int, free: int, ends: Iterable[tuple[float, int]], now: float
) -> tuple[float, int]:
    """(when `gpus` GPUs will be free, how many will be free then) given `free` now and the
    running jobs' (expected end, GPUs held), earliest first."""
    available = free
    if available >= gpus:
        return now, available
    for end, held in ends:
        available += held
        if available >= gpus:
            return max(end, now), available
    return math.inf, available


def fits_before(res: Reservation, gpus: int, est_runtime_s: float, now: float) -> bool:
    """Whether a backfill candidate leaves the reservation intact; consumes the extra GPUs it
    would use past the shadow time."""
    if now + est_runtime_s <= res.shadow_time:
        return True
    if gpus <= res.extra:
        res.extra -= gpus
        return True
    return False
