"""Why a queued job is waiting, worked out from a snapshot of the engine (`web.snapshot`).

The engine does not record why a job did not start (a cycle tries every accepted GPU type and
size and moves on), so the dashboard reconstructs the most specific obstacle from the free
capacity, following placement's own rules (`engine.placement`):

* `preempting` — it already holds GPUs and waits for tier-2 victims to use up their grace;
* `quota` — a tier-1 job beyond its team's quota plus what is left of the unowned pool (tier 1
  may not borrow another team's guarantee, S2; meanwhile it starts at tier 2 as soon as a
  tier-2 job could, on idle GPUs or those of tier-3 and borrowed tier-2 jobs, see
  `EngineConfig.tier1_borrows_at_tier2`);
* `capacity` — fewer free GPUs of every accepted type than it needs;
* `gang` — enough free GPUs in total, but no node has them all for a job that must sit on one
  node (S3);
* `topology` — tensor-parallel groups do not fit inside NVLink domains, or `max_racks` racks do
  not hold enough (S5);
* `power` — the free GPUs are in racks without the power headroom to run them (S10);
* `reserved` — it would fit now, but the free GPUs are kept for an earlier, higher-priority job
  (backfill may not delay it) or the next cycle has not looked at it yet.

A team out of credits has its jobs capped at tier 3 (E1); its jobs say `budget` first, with the
obstacle above after it. Across accepted GPU types the reason of the type the job came closest
to running on is given. Each distinct request shape is analysed once per snapshot, so a queue of
thousands of similar jobs costs a few of these analyses.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpu_arbiter.domain import MILLI
from gpu_arbiter.web.snapshot import NodeState, PendingJob, Snapshot

# How far a request got on one GPU type: the largest wins across types.
_PROGRESS = ("capacity", "gang", "topology", "power", "reserved")


@dataclass(frozen=True, slots=True)
class Reason:
    code: str
    text: str


def usable(node: NodeState, tp: int) -> int:
    """GPUs of `node` a job with tensor-parallel groups of `tp` can use: whole groups inside
    each NVLink domain."""
    if node.domain >= node.gpus:
        free = node.free_mask.bit_count()
        return free // tp * tp
    full = (1 << node.domain) - 1
    total = 0
    for d in range(node.gpus // node.domain):
        total += ((node.free_mask >> (d * node.domain)) & full).bit_count() // tp * tp
    return total


class ReasonFinder:
    """Reasons for the jobs of one snapshot (memoised by request shape)."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.by_type: dict[str, list[NodeState]] = {}
        for n in snap.nodes:
            if n.state == "up" and n.gpus:
                self.by_type.setdefault(n.gpu_type, []).append(n)
        self.max_size = {t: max(n.gpus for n in ns) for t, ns in self.by_type.items()}
        self.exhausted = {
            t.name for t in snap.teams if t.remaining is not None and t.remaining <= 0
        }
        self._memo: dict[tuple, Reason] = {}

    def reason(self, job: PendingJob) -> Reason:
        if job.waiting_on:
            return Reason(
                "preempting",
                f"holds GPUs while {job.waiting_on} tier-2 job(s) checkpoint and stop "
                "(their grace period)",
            )
        if not job.tier1_quota_ok:
            types = "/".join(job.gpu_types) or "any type"
            return Reason(
                "quota",
                f"tier 1 needs {job.gpus} {types} within team {job.team}'s quota plus the "
                "unowned pool; tier 1 may not borrow another team's guarantee (it starts at "
                "tier 2, preemptible with notice, as soon as a tier-2 job could)",
            )
        found = self._placement(job)
        if job.team in self.exhausted and job.tier > job.requested_tier:
            return Reason(
                "budget",
                f"team {job.team} has spent this period's credits, so the job runs only at "
                f"tier {job.tier} (asked for tier {job.requested_tier}); {found.text}",
            )
        return found

    def _placement(self, job: PendingJob) -> Reason:
        key = (job.gpu_types, job.gpus, job.tp, job.max_racks, job.power_profile, job.gpu_milli)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._best(job)
            self._memo[key] = hit
        return hit

    def _best(self, job: PendingJob) -> Reason:
        found = [self._on_type(job, t) for t in job.gpu_types if t in self.by_type]
        if not found:
            return Reason("capacity", "no GPU of an accepted type is in service")
        return max(found, key=lambda r: _PROGRESS.index(r.code))

    def _on_type(self, job: PendingJob, t: str) -> Reason:
        nodes = self.by_type[t]
        n = job.gpus
        if job.gpu_milli < MILLI:
            n = 1
        free = sum(nd.free_mask.bit_count() for nd in nodes)
        if free < n:
            return Reason(
                "capacity",
                f"needs {n} {t}, {free} free: running jobs it may not preempt hold the rest",
            )
        watts = self.snap.watts_per_gpu.get((t, job.power_profile), 0.0)
        if n <= self.max_size[t]:
            return self._one_node(nodes, t, n, job.tp, watts)
        return self._across_nodes(nodes, t, n, job.tp, job.max_racks, watts)

    def _one_node(self, nodes: list[NodeState], t: str, n: int, tp: int, watts: float) -> Reason:
        big = [nd for nd in nodes if nd.free_mask.bit_count() >= n]
        if not big:
            most = max(nd.free_mask.bit_count() for nd in nodes)
            return Reason(
                "gang",
                f"needs {n} {t} on one node: enough are free in total, but split across "
                f"nodes (at most {most} free on one)",
            )
        fit = [nd for nd in big if usable(nd, tp) >= n]
        if not fit:
            return Reason(
                "topology",
                f"tensor-parallel groups of {tp} must each sit in one NVLink domain; no node "
                f"has {n} free {t} that way",
            )
        head = self.snap.rack_headroom_w
        if not any(head.get(nd.rack, 0.0) >= n * watts for nd in fit):
            return Reason("power", _power_text(n, t, {nd.rack for nd in fit}))
        return _reserved(n, t)

    def _across_nodes(
        self,
        nodes: list[NodeState],
        t: str,
        n: int,
        tp: int,
        max_racks: int | None,
        watts: float,
    ) -> Reason:
        per_rack: dict[str, int] = {}
        for nd in nodes:
            per_rack[nd.rack] = per_rack.get(nd.rack, 0) + usable(nd, tp)
        if sum(per_rack.values()) < n:
            return Reason(
                "topology",
                f"tensor-parallel groups of {tp} must each sit in one NVLink domain; only "
                f"{sum(per_rack.values())} free {t} can be used that way",
            )
        head = self.snap.rack_headroom_w
        powered = {
            r: min(f, int(head.get(r, 0.0) // watts) // tp * tp if watts else f)
            for r, f in per_rack.items()
        }
        if sum(powered.values()) < n:
            return Reason("power", _power_text(n, t, {r for r, f in per_rack.items() if f}))
        if max_racks:
            if _top(per_rack.values(), max_racks) < n:
                return Reason(
                    "topology",
                    f"needs {n} {t} within {max_racks} rack(s); the {max_racks} emptiest "
                    f"racks have {_top(per_rack.values(), max_racks)} free",
                )
            if _top(powered.values(), max_racks) < n:
                return Reason("power", _power_text(n, t, set(per_rack)))
        return _reserved(n, t)


def _top(values: Iterable[int], k: int) -> int:
    return sum(sorted(values, reverse=True)[:k])


def _power_text(n: int, t: str, racks: set[str]) -> str:
    names = ", ".join(sorted(racks)[:3]) + (" ..." if len(racks) > 3 else "")
    return f"{n} {t} are free, but their racks ({names}) lack the power headroom to run them"


def _reserved(n: int, t: str) -> Reason:
    return Reason(
        "reserved",
        f"{n} {t} are free, but kept for an earlier, higher-priority job (or not yet looked at "
        "by the next cycle)",
    )


def reasons(snap: Snapshot) -> dict[str, Reason]:
    """The reason of every queued job of `snap`, by job id."""
    finder = ReasonFinder(snap)
    return {job.id: finder.reason(job) for job in snap.pending}
