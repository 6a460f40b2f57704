"""Invariants of the scheduler's state, rebuilt from first principles after a cycle.

Each check recomputes what the capacity index, quota book and power draw should be from the
running jobs' allocations and the GPUs held for preemptors, and compares: the index is updated
incrementally, so any drift between the two is a bug.
"""

from __future__ import annotations

from gpu_arbiter.domain import MILLI, Allocation, Decision, Job, Preempt, Resize, Start, Tier
from gpu_arbiter.engine import Scheduler
from gpu_arbiter.engine.capacity import POWER_FACTOR
from gpu_arbiter.engine.migration import never_worth
from gpu_arbiter.engine.placement import gpus_to_mask


def busy_masks(sched: Scheduler) -> list[int]:
    """GPUs taken per node by running jobs and holds; fails on any GPU taken twice."""
    busy = [0] * len(sched.cluster.nodes)
    owner: dict[tuple[int, int], str] = {}

    def claim(who: str, node: int, mask: int) -> None:
        for g in range(sched.index.size[node]):
            if mask >> g & 1:
                key = (node, g)
                assert key not in owner, f"GPU {key} held by {owner[key]} and {who}"
                owner[key] = who
        busy[node] |= mask

    shared: dict[tuple[int, int], int] = {}  # GPUs fractional jobs share (S11): milli in use
    for job in sched.running.values():
        assert job.allocation is not None, f"running job {job.id} has no allocation"
        if job.spec.gpu_milli < MILLI:
            ((node, (gpu,)),) = job.allocation.slots
            shared[(node, gpu)] = shared.get((node, gpu), 0) + job.spec.gpu_milli
            continue
        for node, gpus in job.allocation.slots:
            claim(job.id, node, gpus_to_mask(gpus))
    assert all(milli <= MILLI for milli in shared.values()), f"a GPU over 1000 milli: {shared}"
    assert shared == sched.shared.used, "shared GPUs drifted"
    for node, gpu in shared:
        claim("fractional jobs", node, 1 << gpu)
    for hold in sched.holds.values():
        for node, mask in hold.held:
            claim(f"hold for {hold.job.id}", node, mask)
    return busy


def check_capacity(sched: Scheduler) -> None:
    """Free masks, buckets and totals agree with the allocations; rack power is exact and
    within every cap."""
    index = sched.index
    busy = busy_masks(sched)
    type_free: dict[str, int] = {t: 0 for t in index.type_free}
    rack_free: dict[tuple[str, int], int] = {k: 0 for k in index.rack_free}
    whole: dict[str, int] = {t: 0 for t in index.whole_free}
    for node in sched.cluster.nodes:
        i = node.index
        if not node.gpus:
            continue
        full = (1 << node.gpus) - 1
        expect = 0 if index.down[i] else full & ~busy[i]
        assert index.free_mask[i] == expect, f"node {node.name}: free mask drifted"
        k = expect.bit_count()
        assert index.free[i] == k
        t, r = node.gpu_type, index.node_rack[i]
        for j, bucket in enumerate(index.buckets[t]):
            assert (i in bucket) == (j == k and k > 0), f"node {node.name} in wrong bucket {j}"
        for j, bucket in enumerate(index.rack_buckets[(t, r)]):
            assert (i in bucket) == (j == k and k > 0), f"node {node.name} in wrong rack bucket"
        type_free[t] += k
        rack_free[(t, r)] += k
        whole[t] += node.gpus if k == node.gpus else 0
    assert index.type_free == type_free
    assert index.rack_free == rack_free
    assert index.whole_free == whole
    check_power(sched)


def check_power(sched: Scheduler) -> None:
    """The index books running jobs and GPUs held for a preemptor; only running jobs draw
    power, and that draw stays within every rack's cap (S10)."""
    index = sched.index
    idle = [0.0] * len(index.rack_names)
    for node in sched.cluster.nodes:
        idle[index.node_rack[node.index]] += node.idle_power_w
    running = [0.0] * len(index.rack_names)
    held = [0.0] * len(index.rack_names)
    types = sched.cluster.gpu_types

    def watts(job: Job, gpu_type: str) -> float:
        return types[gpu_type].power_w * POWER_FACTOR[job.spec.power_profile]

    for job in sched.running.values():
        if job.spec.gpu_milli < MILLI:
            continue  # its GPU's power is booked once, by the job that opened it (S11)
        w = watts(job, job.allocation.gpu_type)
        for node, gpus in job.allocation.slots:
            running[index.node_rack[node]] += w * len(gpus)
    assert sched.shared.watts.keys() == sched.shared.used.keys()
    for (node, _), w in sched.shared.watts.items():
        running[index.node_rack[node]] += w
    for hold in sched.holds.values():
        w = watts(hold.job, hold.allocation.gpu_type)
        for node, mask in hold.held:
            held[index.node_rack[node]] += w * mask.bit_count()
    for r, name in enumerate(index.rack_names):
        booked = idle[r] + running[r] + held[r]
        assert abs(index.rack_power[r] - booked) < 1e-6, f"rack {name}: power drifted"
        draw = idle[r] + running[r]
        assert draw <= index.rack_cap[r] + 1e-6, f"rack {name}: {draw} W over its cap"


def check_quotas(sched: Scheduler) -> None:
    """A team's jobs that are not marked borrowed fit in its guarantee, per GPU type."""
    owned: dict[tuple[str, str], int] = {}
    for job in sched.running.values():
        if not job.borrowed:
            key = (job.team, job.allocation.gpu_type)
            owned[key] = owned.get(key, 0) + job.milli_held
    for (team, t), milli in owned.items():
        limit = sched.quota.limit(team, t)
        assert milli <= limit, f"team {team} holds {milli} guaranteed {t} milli, quota {limit}"


def check_move_index(sched: Scheduler) -> None:
    """`slower_than` holds the running jobs that would run faster on each type, less only
    moves that can never be worth it for the rest of the job's run (`never_worth` still
    holds for them, later in the run)."""
    want: dict[str, set[str]] = {t: set() for t in sched.slower_than}
    for job in sched.running.values():
        for t in sched.types_by_speed(job):
            if sched.speed(job, t) > job.speed and t != job.allocation.gpu_type:
                want[t].add(job.id)
    got = {t: set(jobs) for t, jobs in sched.slower_than.items()}
    for t, ids in got.items():
        assert ids <= want[t], f"move index for {t}: {ids - want[t]} would not run faster"
        for job_id in want[t] - ids:
            assert _never_worth_now(sched, sched.running[job_id], t), (job_id, t)


def _never_worth_now(sched: Scheduler, job: Job, gpu_type: str) -> bool:
    rules = getattr(sched.policy, "moves", None)
    if rules is None:
        return False  # only a policy that moves jobs rules moves out
    notice = sched.notice_of_tier(int(job.tier)) if int(job.tier) in rules.noticed_tiers else 0
    return never_worth(
        job.spec.walltime_s,
        job.progress_s / job.spec.duration_s,
        job.rate,
        sched.speed(job, gpu_type) * job.gpus_held / job.spec.gpus,
        sched.cfg.restart_overhead_s,
        sched.notice_s(notice) if notice > 0 else None,
        job.spec.duration_s,
        rules,
    )


def check_allocation(sched: Scheduler, job: Job, alloc: Allocation) -> None:
    """A gang: its whole size within the elastic range, on one accepted type, tp groups inside
    NVLink domains, no node twice."""
    lo, hi = job.spec.elastic_range
    if not (sched.policy.elastic and job.spec.is_elastic):
        lo = hi = job.spec.gpus
    assert lo <= alloc.gpus <= hi, f"{job.id}: {alloc.gpus} GPUs outside [{lo}, {hi}]"
    assert sched.speed(job, alloc.gpu_type) is not None, f"{job.id}: on unaccepted type"
    nodes = [n for n, _ in alloc.slots]
    assert len(nodes) == len(set(nodes)), f"{job.id}: a node listed twice"
    tp = job.spec.tp_size
    for node, gpus in alloc.slots:
        assert sched.cluster.nodes[node].gpu_type == alloc.gpu_type
        assert gpus, f"{job.id}: empty slot on node {node}"
        domain = sched.index.domain[node]
        per_domain: dict[int, int] = {}
        for g in gpus:
            per_domain[g // domain] = per_domain.get(g // domain, 0) + 1
        assert all(c % tp == 0 for c in per_domain.values()), f"{job.id}: tp group straddles"
    if job.spec.max_racks is not None:
        racks = {sched.index.node_rack[n] for n in nodes}
        assert len(racks) <= job.spec.max_racks, f"{job.id}: spans {len(racks)} racks"


def check_decisions(sched: Scheduler, decisions: list[Decision], tier1_safe: bool) -> None:
    for d in decisions:
        job = sched.jobs[d.job_id]
        if isinstance(d, Start | Resize):
            check_allocation(sched, job, d.allocation)
        if tier1_safe and isinstance(d, Preempt):
            assert job.tier != Tier.CORE, f"tier-1 job {job.id} preempted: {d.reason}"
        if tier1_safe and isinstance(d, Resize) and job.tier == Tier.CORE:
            assert not d.reason.startswith("shrunk"), f"tier-1 job {job.id} shrunk"


def check_all(sched: Scheduler, decisions: list[Decision]) -> None:
    arbiter = sched.policy.name == "arbiter"
    check_capacity(sched)
    check_move_index(sched)
    check_decisions(sched, decisions, tier1_safe=arbiter)
    if arbiter:
        check_quotas(sched)
