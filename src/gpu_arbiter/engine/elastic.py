"""Elastic jobs (S8): start as large as fits, shrink instead of being stopped, grow back."""

from __future__ import annotations

from gpu_arbiter.domain import Allocation, Job, JobSpec
from gpu_arbiter.engine.capacity import CapacityIndex
from gpu_arbiter.engine.placement import mask_to_gpus, pick_gpus


def start_sizes(spec: JobSpec, elastic: bool) -> list[int]:
    """Sizes to try at start, largest first: max, the requested size, then min."""
    if not elastic or not spec.is_elastic:
        return [spec.gpus]
    lo, hi = spec.elastic_range
    return sorted({hi, spec.gpus, lo}, reverse=True)


def shrunk_allocation(job: Job) -> Allocation | None:
    """The allocation a running elastic job keeps when shrunk to its minimum, dropping GPUs from
    its last nodes first (whole tensor-parallel groups only); None if it cannot shrink."""
    alloc = job.allocation
    lo, _ = job.spec.elastic_range
    if alloc is None or alloc.gpus <= lo:
        return None
    tp = job.spec.tp_size
    keep = lo
    slots = []
    for node, gpus in alloc.slots:
        if keep <= 0:
            break
        take = min(len(gpus), keep) // tp * tp
        if take:
            slots.append((node, gpus[:take]))
            keep -= take
    if keep > 0:
        return None
    return Allocation(alloc.gpu_type, tuple(slots))


def grown_allocation(index: CapacityIndex, job: Job, watts: float) -> Allocation | None:
    """A larger allocation for a running elastic job, using free GPUs on the nodes it already
    holds and then wholly free nodes in its racks, up to its max; None if it cannot grow."""
    alloc = job.allocation
    _, hi = job.spec.elastic_range
    if alloc is None or alloc.gpus >= hi:
        return None
    tp = job.spec.tp_size
    want = hi - alloc.gpus
    slots = {n: list(gs) for n, gs in alloc.slots}
    budget: dict[int, float] = {}

    def room(node: int) -> int:
        rack = index.node_rack[node]
        budget.setdefault(rack, index.power_headroom(rack))
        return int(budget[rack] // watts)

    def add(node: int, n: int) -> None:
        nonlocal want
        mask = pick_gpus(index.free_mask[node], index.size[node], index.domain[node], n, tp)
        if mask is None:
            return
        slots.setdefault(node, []).extend(mask_to_gpus(mask))
        budget[index.node_rack[node]] -= n * watts
        want -= n

    for node in list(slots):
        n = min(index.free[node], want, room(node)) // tp * tp
        if n:
            add(node, n)
    racks = {index.node_rack[n] for n in slots}
    for rack in sorted(racks):
        key = (alloc.gpu_type, rack)
        for k in range(len(index.rack_buckets[key]) - 1, 0, -1):
            for node in list(index.rack_buckets[key][k]):
                if want < k or node in slots or k != index.size[node]:
                    continue
                n = min(k, room(node)) // tp * tp
                if n:
                    add(node, n)
    if sum(len(g) for g in slots.values()) == alloc.gpus:
        return None
    return Allocation(alloc.gpu_type, tuple((n, tuple(sorted(g))) for n, g in slots.items()))
