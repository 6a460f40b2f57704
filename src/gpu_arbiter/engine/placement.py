"""Where a gang goes: topology-, fragmentation- and power-aware placement (S3, S5, S6, S10).

A placement is all-or-nothing: it returns the exact GPUs of the whole gang or None, and never
changes the capacity index (the scheduler commits it). Strategies:

- ``pack`` (Arbiter): best fit. A job that fits in one node goes to the node with the fewest
  free GPUs that still fits it, so whole nodes stay free for large gangs; a multi-node gang goes
  to the single rack, else the single pod, with the least spare room that fits it, whole nodes
  first and the remainder on the best-fitting partial node.
- ``spread``: the node or racks with the most free GPUs first (what a load-spreading scheduler
  such as the default Kubernetes scheduler does); used by baselines.

Tensor-parallel groups of `tp` GPUs never straddle an NVLink domain. A rack's power cap is never
exceeded: each GPU counts at its board power times the job's power-profile factor.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpu_arbiter.domain import Allocation
from gpu_arbiter.engine.capacity import CapacityIndex

MAX_POWER_SKIPS = 256  # nodes skipped for a full rack before a single-node search gives up


@dataclass(frozen=True, slots=True)
class Request:
    gpu_type: str
    gpus: int
    tp: int = 1
    max_racks: int | None = None
    power_profile: str = "normal"
    locality: str | None = None


def place(
    index: CapacityIndex, req: Request, strategy: str = "pack", avoid: int | None = None
) -> Allocation | None:
    """The gang's GPUs, or None; none on node `avoid` (one a backfill reservation holds)."""
    if req.gpu_type not in index.buckets or index.type_free[req.gpu_type] < req.gpus:
        return None
    if req.gpus <= index.max_size[req.gpu_type]:
        return _place_in_one_node(index, req, strategy == "pack", avoid)
    return _place_across_nodes(index, req, strategy == "pack", avoid)


def may_place_after(index: CapacityIndex, req: Request, freed: Iterable[Allocation]) -> bool:
    """False when `place` cannot find the gang with any subset of `freed` (busy GPUs)
    released, so a preemption plan over those victims need not be searched.

    `place` succeeds only where some node could hold a single-node gang on its own (enough
    free GPUs in whole tensor-parallel groups per NVLink domain, `pick_gpus`), or where the
    `max_racks` roomiest racks hold a multi-node gang in whole groups of each node (`_fill`
    takes whole groups per node); both only grow as GPUs are freed, so where they fail with
    every allocation in `freed` released, they fail with any subset released. Power caps and
    the node a reservation keeps are not counted: the test may pass where placement fails,
    never the reverse."""
    t, n = req.gpu_type, req.gpus
    extra: dict[int, int] = {}  # node -> the GPUs `freed` holds there
    for alloc in freed:
        for node, gpus in alloc.slots:
            extra[node] = extra.get(node, 0) | gpus_to_mask(gpus)
    if n <= index.max_size[t]:  # placed on one node: a node that could take it
        for node, mask in extra.items():
            free = index.free_mask[node] | mask
            if pick_gpus(free, index.size[node], index.domain[node], n, req.tp) is not None:
                return True
        buckets = index.buckets[t]
        return any(
            pick_gpus(index.free_mask[node], index.size[node], index.domain[node], n, req.tp)
            is not None
            for k in range(n, len(buckets))
            for node in buckets[k]
            if node not in extra
        )
    room = {r: index.rack_free[(t, r)] for r in index.type_racks[t]}
    for node, mask in extra.items():  # a node gives a multi-node gang whole groups only
        free = index.free_mask[node]
        groups = _groups(free | mask, index.size[node], index.domain[node], req.tp)
        room[index.node_rack[node]] += groups - free.bit_count()
    usable = sorted((f // req.tp * req.tp for f in room.values()), reverse=True)
    return sum(usable[: req.max_racks or len(usable)]) >= n


def _groups(free_mask: int, size: int, domain: int, tp: int) -> int:
    """The most GPUs of a node's free mask in whole groups of `tp` within NVLink domains."""
    if domain >= size:
        return free_mask.bit_count() // tp * tp
    dfull = (1 << domain) - 1
    return sum(
        ((free_mask >> (d * domain)) & dfull).bit_count() // tp * tp for d in range(size // domain)
    )


def pick_gpus(free_mask: int, size: int, domain: int, n: int, tp: int) -> int | None:
    """A mask of `n` free GPUs of one node such that every group of `tp` GPUs lies in one NVLink
    domain, filling the fullest-used domain that fits first; None when impossible."""
    if free_mask.bit_count() < n:
        return None
    if domain >= size:
        return _lowest_bits(free_mask, n)
    dfull = (1 << domain) - 1
    usable = []
    for d in range(size // domain):
        dm = (free_mask >> (d * domain)) & dfull
        cnt = dm.bit_count() // tp * tp
        if cnt:
            usable.append((cnt, d, dm))
    fits = [u for u in usable if u[0] >= n]
    if fits:  # the whole job in one domain when it fits in one
        _, d, dm = min(fits)
        return _lowest_bits(dm, n) << (d * domain)
    if sum(u[0] for u in usable) < n:
        return None
    mask, remaining = 0, n
    for cnt, d, dm in sorted(usable, reverse=True):
        take = min(cnt, remaining)
        mask |= _lowest_bits(dm, take) << (d * domain)
        remaining -= take
        if not remaining:
            return mask
    return None


def mask_to_gpus(mask: int) -> tuple[int, ...]:
    out = []
    i = 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return tuple(out)


def gpus_to_mask(gpus: tuple[int, ...]) -> int:
    m = 0
    for g in gpus:
        m |= 1 << g
    return m


def _lowest_bits(mask: int, n: int) -> int:
    out = 0
    for _ in range(n):
        low = mask & -mask
        out |= low
        mask ^= low
    return out


def _watts(index: CapacityIndex, req: Request) -> float:
    return index.watts_per_gpu(req.gpu_type, req.power_profile)


def _place_in_one_node(
    index: CapacityIndex, req: Request, pack: bool, avoid: int | None
) -> Allocation | None:
    t, n = req.gpu_type, req.gpus
    w = _watts(index, req)
    need_w = n * w
    if req.locality:
        for rack in index.label_racks(req.locality, t):
            buckets = index.rack_buckets[(t, rack)]
            alloc = _search_buckets(index, buckets, req, need_w, pack, avoid)
            if alloc:
                return alloc
    return _search_buckets(index, index.buckets[t], req, need_w, pack, avoid)


def _search_buckets(
    index: CapacityIndex, buckets, req: Request, need_w: float, pack: bool, avoid: int | None
):
    n = req.gpus
    top = len(buckets) - 1
    ks = range(n, top + 1) if pack else range(top, n - 1, -1)
    skips = 0
    for k in ks:
        for node in buckets[k]:
            if node == avoid:
                continue
            if index.power_headroom(index.node_rack[node]) < need_w:
                skips += 1
                if skips > MAX_POWER_SKIPS:
                    return None
                continue
            mask = pick_gpus(index.free_mask[node], index.size[node], index.domain[node], n, req.tp)
            if mask is not None:
                return Allocation(req.gpu_type, ((node, mask_to_gpus(mask)),))
    return None


EXTRA_RACKS = 2  # racks added when the fewest that cover a gang in number cannot hold it


def _place_across_nodes(
    index: CapacityIndex, req: Request, pack: bool, avoid: int | None
) -> Allocation | None:
    t, n = req.gpu_type, req.gpus
    w = _watts(index, req)
    usable: list[tuple[int, int]] = []  # (GPUs usable within power, rack)
    for r in index.type_racks[t]:
        f = index.rack_free[(t, r)]
        if f:
            u = min(f, int(index.power_headroom(r) // w)) // req.tp * req.tp
            if u:
                usable.append((u, r))
    if sum(u for u, _ in usable) < n:
        return None
    # Each step below places the gang on at most `limit` racks: where even the largest that
    # many cannot cover it in number, none can (the common failure of a preemption search).
    limit = req.max_racks or len(usable)
    fewest = _largest_covering(usable, n, limit)
    if not fewest:
        return None
    local = index.label_racks(req.locality, t) if req.locality else ()

    def rank(item: tuple[int, int]) -> tuple:
        u, r = item
        return (r not in local, u if pack else -u, r)

    # 1. one rack
    for _, r in sorted((x for x in usable if x[0] >= n), key=rank):
        alloc = _fill(index, req, [r], w, pack, avoid)
        if alloc:
            return alloc
    if req.max_racks == 1:
        return None
    # 2. one pod, fewest racks (largest first), best-fitting pod first
    by_pod: dict[str, list[tuple[int, int]]] = {}
    for u, r in usable:
        by_pod.setdefault(index.rack_pod[r], []).append((u, r))
    pods = []
    for pod, racks in by_pod.items():
        chosen = _largest_covering(racks, n, limit)
        if chosen:
            pods.append((sum(u for u, _ in chosen) if pack else -len(chosen), pod, chosen))
    for _, _, chosen in sorted(pods):
        alloc = _fill(index, req, [r for _, r in chosen], w, pack, avoid)
        if alloc:
            return alloc
    # 3. across pods, fewest racks; a rack's usable count is an upper bound (tensor-parallel
    # groups must fit within nodes), so a few more racks are tried before giving up
    ordered = sorted(usable, key=lambda x: (-x[0], x[1]))
    for k in range(len(fewest), min(limit, len(ordered), len(fewest) + EXTRA_RACKS) + 1):
        alloc = _fill(index, req, [r for _, r in ordered[:k]], w, pack, avoid)
        if alloc:
            return alloc
    return None


def _largest_covering(racks: list[tuple[int, int]], n: int, limit: int) -> list[tuple[int, int]]:
    """The fewest racks (at most `limit`, largest first) whose usable GPUs cover n, or []."""
    out, total = [], 0
    for item in sorted(racks, key=lambda x: (-x[0], x[1])):
        out.append(item)
        total += item[0]
        if total >= n:
            return out
        if len(out) >= limit:
            return []
    return []


def _fill(
    index: CapacityIndex, req: Request, racks: list[int], w: float, pack: bool, avoid: int | None
):
    """Pick nodes inside `racks` for the whole gang: nodes with the most free GPUs first while
    the remainder is at least that large, then the best-fitting node for the remainder."""
    t, tp = req.gpu_type, req.tp
    remaining = req.gpus
    budget = {r: index.power_headroom(r) for r in racks}
    slots: list[tuple[int, tuple[int, ...]]] = []
    taken: set[int] = set() if avoid is None else {avoid}  # `avoid` counts as taken already
    top = index.max_size[t]

    def take(node: int, c: int) -> bool:
        nonlocal remaining
        r = index.node_rack[node]
        c = min(c, int(budget[r] // w)) // tp * tp
        if c <= 0:
            return False
        mask = pick_gpus(index.free_mask[node], index.size[node], index.domain[node], c, tp)
        if mask is None:
            return False
        slots.append((node, mask_to_gpus(mask)))
        taken.add(node)
        budget[r] -= c * w
        remaining -= c
        return True

    for k in range(top, 0, -1):
        for r in racks:
            for node in index.rack_buckets[(t, r)][k]:
                if remaining < k:
                    break
                if node not in taken:
                    take(node, k)
        if remaining == 0:
            break
    if remaining and pack:
        for k in range(remaining, top + 1):
            for r in racks:
                for node in index.rack_buckets[(t, r)][k]:
                    if node not in taken and take(node, remaining):
                        break
                if not remaining:
                    break
            if not remaining:
                break
    if remaining:
        for k in range(top, 0, -1):  # any node with room, also one with more than needed
            for r in racks:
                for node in list(index.rack_buckets[(t, r)][k]):
                    if remaining and node not in taken:
                        take(node, min(k, remaining))
    if remaining:
        return None
    return Allocation(t, tuple(slots))
