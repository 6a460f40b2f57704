"""Reservation-based (EASY) backfill (S6).

When the highest-priority job that wants a GPU type cannot start, it gets a reservation: the
earliest time (the *shadow time*) at which, by the running jobs' walltime estimates, enough GPUs
of that type will be free, and the *extra* GPUs that will be free then beyond its need. A later,
lower-priority job may start now only if it will end before the shadow time, or if it fits in
the extra GPUs — so it can never delay the reserved start.

A job that must sit on one node (a gang no larger than a node) waits for a node, not for a
count: its reservation may name the node expected to have room for it first
(`node_free_at`). Then only that node is held: a later job that may not delay the start is
placed on any other node, and the rest of the type stays open to everyone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpu_arbiter.domain import Allocation, Job


@dataclass(slots=True)
class Reservation:
    job_id: str
    gpu_type: str
    gpus: int
    shadow_time: float
    extra: int
    node: int | None = None  # the one node held (its GPUs beyond need are `extra`); None: all

    def copy(self) -> Reservation:
        """A copy to book on (`fits_before` takes from `extra`): a cycle copies every kept
        reservation, so this spells the fields out rather than go through `dataclasses.replace`'s
        generic field walk."""
        return Reservation(
            self.job_id, self.gpu_type, self.gpus, self.shadow_time, self.extra, self.node
        )

    def covers(self, alloc: Allocation) -> bool:
        """Whether the allocation takes GPUs the reservation counts on."""
        return self.node is None or self.node in alloc.nodes


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


def node_free_at(
    gpus: int, free: Callable[[int], int], ends: Iterable[tuple[float, Allocation]], now: float
) -> tuple[int, float, int] | None:
    """(node, when, GPUs free there then) for the first node, by the running jobs' (expected
    end, allocation), earliest first, to have `gpus` free; None if none ever does. `free` gives
    a node's free GPUs now, or a negative number for a node not to wait for."""
    missing: dict[int, float] = {}
    for end, alloc in ends:
        for node, held in alloc.slots:
            left = missing.get(node)
            if left is None:
                has = free(node)
                if has < 0:
                    missing[node] = math.inf
                    continue
                left = gpus - has
            left -= len(held)
            missing[node] = left
            if left <= 0:
                return node, max(end, now), -left
    return None


def may_take(res: Reservation, job_id: str, gpus: int, est_runtime_s: float, now: float) -> bool:
    """Whether a job may take GPUs the reservation counts on: it is the holder, it ends before
    the shadow time, or it fits in the extra GPUs (which `fits_before` then books)."""
    return res.job_id == job_id or now + est_runtime_s <= res.shadow_time or gpus <= res.extra


def fits_before(res: Reservation, gpus: int, est_runtime_s: float, now: float) -> bool:
    """Whether a backfill candidate leaves the reservation intact; consumes the extra GPUs it
    would use past the shadow time."""
    if now + est_runtime_s <= res.shadow_time:
        return True
    if gpus <= res.extra:
        res.extra -= gpus
        return True
    return False
