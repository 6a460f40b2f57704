"""Why a pending job waits, as the engine records it (as Kueue records it on the workload).

The walk (`engine.walk`) notes on every full try that leaves a job pending what it found out
cheaply: the smallest size it asked for, the reservation that kept it off GPUs it could have
used (backfill may not delay that job) and whether it was set aside as hopeless (no accepted
type has its GPUs free and nobody it may stop runs there). Starting or cancelling the job
clears the note. `why_pending` turns the note into a `Waiting` reason when asked, with the
obstacle worked out from the engine's own state (`CapacityIndex`, quota book, holds), so the
walk pays one dict entry per failed try and the wording costs only whoever reads it:

* `preempting` — it holds GPUs and waits for tier-2 victims to use up their grace;
* `queued` — no cycle has looked at it yet;
* `quota` — a tier-1 job beyond its team's quota plus what is left of the unowned pool (tier 1
  may not borrow another team's guarantee, S2);
* `capacity` — fewer free GPUs of every accepted type than it needs;
* `gang` — enough free GPUs in total, but no node has them all for a job that must sit on one
  node (S3);
* `topology` — tensor-parallel groups do not fit inside NVLink domains, or `max_racks` racks do
  not hold enough (S5);
* `power` — the free GPUs are in racks without the power headroom to run them (S10);
* `reserved` — it would fit now, but the free GPUs are kept for an earlier, higher-priority job
  (named), or its next try comes with the next cycle.

A team out of credits has its jobs capped at a lower tier (E1); its jobs say `budget` first,
with the obstacle above after it. Across accepted GPU types the reason of the type the job came
closest to running on is given. Each distinct request shape is analysed once per call of
`waiting_reasons`, so a queue of thousands of similar jobs costs a few analyses.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpu_arbiter.domain import MILLI, Job, JobState, Tier
from gpu_arbiter.engine.elastic import start_sizes

# How far a request got on one GPU type: the largest wins across types.
_PROGRESS = ("capacity", "gang", "topology", "power", "reserved")


@dataclass(frozen=True, slots=True)
class Waiting:
    """Why a pending job waits: a short `code` (see the module doc) and a sentence."""

    code: str
    text: str


# What a full try that left the job pending noted (`Walk._failed`), a plain tuple as the walk
# makes one per failed try: the smallest size it asked for, the job whose reservation kept it
# off GPUs it could have used (or None), and whether it was hopeless.
Tried = tuple[int, str | None, bool]


def usable(free_mask: int, gpus: int, domain: int, tp: int) -> int:
    """Free GPUs of a node a job with tensor-parallel groups of `tp` can use: whole groups
    inside each NVLink domain."""
    if domain >= gpus:
        return free_mask.bit_count() // tp * tp
    full = (1 << domain) - 1
    total = 0
    for d in range(gpus // domain):
        total += ((free_mask >> (d * domain)) & full).bit_count() // tp * tp
    return total


class WhyPending:
    """The reasons pending jobs wait (mixed into `Scheduler`)."""

    def why_pending(self, job_id: str) -> Waiting | None:
        """Why the job waits, or None when it is not pending."""
        return self.waiting_reasons((job_id,)).get(job_id)

    def waiting_reasons(self, job_ids: Iterable[str] | None = None) -> dict[str, Waiting]:
        """Why each pending job of `job_ids` waits (default: the queue and the jobs holding
        GPUs for their victims), by job id; ids of jobs not pending are left out."""
        if job_ids is None:
            job_ids = [*(j.id for j in self.queue.jobs()), *self.holds]
        finder = _Finder(self, self._waits)
        out = {}
        for job_id in job_ids:
            job = self.jobs.get(job_id)
            if job is not None and job.state == JobState.PENDING:
                out[job_id] = finder.reason(job)
        return out


class _Finder:
    """Reasons over the engine's state as it is now (memoised by request shape)."""

    def __init__(self, sched, waits: dict[str, Tried]) -> None:
        self.sched, self.waits = sched, waits
        index = sched.index
        self.index = index
        self.by_type: dict[str, list[int]] = {}
        for i, t in enumerate(index.node_type):
            if not index.down[i] and index.size[i]:
                self.by_type.setdefault(t, []).append(i)
        self.max_size = {t: max(index.size[i] for i in ns) for t, ns in self.by_type.items()}
        self._memo: dict[tuple, Waiting] = {}

    def reason(self, job: Job) -> Waiting:
        sched = self.sched
        hold = sched.holds.get(job.id)
        if hold is not None:
            return Waiting(
                "preempting",
                f"holds GPUs while {len(hold.waiting)} tier-2 job(s) checkpoint and stop "
                "(their grace period)",
            )
        tried = self.waits.get(job.id)
        n = tried[0] if tried is not None else start_sizes(job.spec, sched.policy.elastic)[-1]
        types = sched.types_by_speed(job)
        if (
            job.tier == Tier.CORE
            and sched.policy.quotas
            and not any(sched.admissible(job, t, n) for t in types)
        ):
            return Waiting(
                "quota",
                f"tier 1 needs {n} {'/'.join(types) or 'any type'} within team {job.team}'s "
                "quota plus the unowned pool; tier 1 may not borrow another team's guarantee",
            )
        if tried is None:
            found = Waiting("queued", "no scheduling cycle has looked at it yet")
        else:
            found = self._placement(job, tuple(types), tried)
        allowed = job.spec.tier if sched.budget is None else sched.budget(job.team, job.spec.tier)
        if job.tier > job.spec.tier and allowed > job.spec.tier:
            return Waiting(
                "budget",
                f"team {job.team} has spent this period's credits, so the job runs only at "
                f"tier {int(job.tier)} (asked for tier {int(job.spec.tier)}); {found.text}",
            )
        return found

    def _placement(self, job: Job, types: tuple[str, ...], tried: Tried) -> Waiting:
        s = job.spec
        key = (types, tried, s.tp_size, s.max_racks, s.power_profile, s.gpu_milli)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._best(job, types, tried)
            self._memo[key] = hit
        return hit

    def _best(self, job: Job, types: tuple[str, ...], tried: Tried) -> Waiting:
        found = [self._on_type(job, t, tried) for t in types if t in self.by_type]
        if not found:
            return Waiting("capacity", "no GPU of an accepted type is in service")
        return max(found, key=lambda r: _PROGRESS.index(r.code))

    def _on_type(self, job: Job, t: str, tried: Tried) -> Waiting:
        nodes = self.by_type[t]
        n = 1 if job.spec.gpu_milli < MILLI else tried[0]
        free = self.index.type_free[t]
        if free < n:
            who = "running jobs it may not preempt hold the rest"
            if self.sched.policy.preemption and not tried[2]:
                who = "running jobs hold the rest, and no preemption plan frees enough now"
            return Waiting("capacity", f"needs {n} {t}, {free} free: {who}")
        watts = self.index.watts_per_gpu(t, job.spec.power_profile)
        tp = job.spec.tp_size
        if n <= self.max_size[t]:
            found = self._one_node(nodes, t, n, tp, watts)
        else:
            found = self._across_nodes(nodes, t, n, tp, job.spec.max_racks, watts)
        return found or self._reserved(job, n, t, tried)

    def _headroom(self, node: int) -> float:
        return self.index.power_headroom(self.index.node_rack[node])

    def _usable(self, node: int, tp: int) -> int:
        index = self.index
        return usable(index.free_mask[node], index.size[node], index.domain[node], tp)

    def _one_node(self, nodes: list[int], t: str, n: int, tp: int, watts: float) -> Waiting | None:
        free = self.index.free
        big = [i for i in nodes if free[i] >= n]
        if not big:
            most = max(free[i] for i in nodes)
            return Waiting(
                "gang",
                f"needs {n} {t} on one node: enough are free in total, but split across "
                f"nodes (at most {most} free on one)",
            )
        fit = [i for i in big if self._usable(i, tp) >= n]
        if not fit:
            return Waiting(
                "topology",
                f"tensor-parallel groups of {tp} must each sit in one NVLink domain; no node "
                f"has {n} free {t} that way",
            )
        if not any(self._headroom(i) >= n * watts for i in fit):
            return Waiting("power", self._power_text(n, t, {self.index.node_rack[i] for i in fit}))
        return None

    def _across_nodes(
        self, nodes: list[int], t: str, n: int, tp: int, max_racks: int | None, watts: float
    ) -> Waiting | None:
        rack_of = self.index.node_rack
        per_rack: dict[int, int] = {}
        for i in nodes:
            per_rack[rack_of[i]] = per_rack.get(rack_of[i], 0) + self._usable(i, tp)
        if sum(per_rack.values()) < n:
            return Waiting(
                "topology",
                f"tensor-parallel groups of {tp} must each sit in one NVLink domain; only "
                f"{sum(per_rack.values())} free {t} can be used that way",
            )
        head = self.index.power_headroom
        powered = {
            r: min(f, int(head(r) // watts) // tp * tp if watts else f) for r, f in per_rack.items()
        }
        if sum(powered.values()) < n:
            return Waiting("power", self._power_text(n, t, {r for r, f in per_rack.items() if f}))
        if max_racks:
            if _top(per_rack.values(), max_racks) < n:
                return Waiting(
                    "topology",
                    f"needs {n} {t} within {max_racks} rack(s); the {max_racks} emptiest "
                    f"racks have {_top(per_rack.values(), max_racks)} free",
                )
            if _top(powered.values(), max_racks) < n:
                return Waiting("power", self._power_text(n, t, set(per_rack)))
        return None

    def _power_text(self, n: int, t: str, racks: set[int]) -> str:
        names = sorted(self.index.rack_names[r] for r in racks)
        shown = ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")
        return f"{n} {t} are free, but their racks ({shown}) lack the power headroom to run them"

    def _reserved(self, job: Job, n: int, t: str, tried: Tried) -> Waiting:
        """The GPUs are free now: kept for the job whose reservation the try met (or that
        holds the type's reservation now), else its next try is due."""
        holder = tried[1]
        res = self.sched.reservations.get(t)
        if holder is None and res is not None and res.job_id != job.id:
            holder = res.job_id
        if holder is not None:
            return Waiting(
                "reserved",
                f"{n} {t} are free, but kept for {holder}, an earlier, higher-priority job "
                "that backfill may not delay",
            )
        return Waiting("reserved", f"{n} {t} are free now; its next try comes with the next cycle")


def _top(values: Iterable[int], k: int) -> int:
    return sum(sorted(values, reverse=True)[:k])
