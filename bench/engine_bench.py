"""Engine benchmarks: scheduling-cycle latency at 100k-GPU scale and simulator throughput.

Measured side by side in one run so the numbers are read as ratios (Arbiter against the
Slurm-like baseline on the same state; indexed placement against a scan of every node), not as
absolute seconds that depend on the machine.
"""

from __future__ import annotations

import gc
import random
import statistics
import time

from gpu_arbiter.domain import JobSpec, JobState, Preempt, Tier
from gpu_arbiter.domain.presets import large, medium
from gpu_arbiter.engine import Scheduler
from gpu_arbiter.engine.placement import Request, pick_gpus, place
from gpu_arbiter.sim import simulate
from gpu_arbiter.traces.synthetic import synthetic_teams, synthetic_workload

SIZES = (1, 2, 4, 8, 8, 16, 32, 64)


def _job(i: int, rng: random.Random, types: list[str]) -> JobSpec:
    g = rng.choice(SIZES)
    dur = rng.uniform(600, 86400)
    accepted = {} if rng.random() < 0.5 else {rng.choice(types): 1.0}
    return JobSpec(
        id=f"b{i}",
        team=rng.choice(["llm-core", "search", "ads", "vision", "speech", "research"]),
        tier=Tier(rng.choice((1, 2, 2, 3, 3, 3))),
        gpus=g,
        duration_s=dur,
        walltime_s=dur * 1.5,
        gpu_types=accepted,
        checkpoint_interval_s=1800.0,
    )


def loaded_scheduler(policy: str, running: int, pending: int, seed: int = 0) -> Scheduler:
    """A `large` cluster with about `running` jobs running and `pending` more queued."""
    cluster = large()
    sched = Scheduler(cluster, synthetic_teams(cluster), policy)
    rng = random.Random(seed)
    types = sorted(cluster.gpus_by_type())
    i = 0
    while len(sched.running) < running:
        batch = [_job(i + k, rng, types) for k in range(500)]
        i += len(batch)
        for spec in batch:
            sched.submit(spec, 0.0)
        sched.cycle(0.0)
        if not sched.index.total_free:
            break
    # Fill what is left with tier-3 single-node jobs so the queue below really waits.
    for size in (8, 4, 2, 1):
        while sched.index.total_free >= size and any(
            sched.index.buckets[t][k] for t in sched.index.buckets for k in range(size, 9)
        ):
            for _ in range(max(1, sched.index.total_free // size // 4)):
                sched.submit(
                    JobSpec(
                        id=f"fill{i}",
                        team="research",
                        gpus=size,
                        duration_s=86400.0,
                        walltime_s=90000.0,
                    ),
                    0.0,
                )
                i += 1
            if not sched.cycle(0.0).started:
                break  # the rest is queued behind jobs that preempt (or wait) first
    for job in list(sched.jobs.values()):
        if job.id.startswith("fill") and job.state == JobState.PENDING:
            sched.cancel(job.id, 0.0)  # leave only the workload's jobs waiting
    while len(sched.queue) < pending:
        sched.submit(_job(i, rng, types), 1.0)
        i += 1
    sched.cycle(1.0)
    # As the control loop does once it has loaded its state (`ControlLoop.start`).
    gc.collect()
    gc.freeze()
    return sched


def cycle_latency(policy: str, running: int, pending: int, cycles: int, seed: int = 0) -> dict:
    """Steady state: each cycle follows one job finishing and one arriving, as in production,
    and the jobs given a stop notice report that they stopped once they have saved, as a driver
    would (`Scheduler.notice_s`)."""
    sched = loaded_scheduler(policy, running, pending, seed)
    rng = random.Random(seed + 1)
    types = sorted(sched.cluster.gpus_by_type())
    times, decisions = [], 0
    now = 2.0
    stops_due: dict[str, float] = {}
    for k in range(cycles):
        for job_id, due in list(stops_due.items()):
            if due <= now:
                del stops_due[job_id]
                if job_id in sched.pending_stops:
                    sched.stopped(job_id, now)
        finished = rng.choice([j for j in sched.running if j not in sched.pending_stops])
        sched.finished(finished, now)
        sched.submit(_job(10_000_000 + k, rng, types), now)
        t0 = time.perf_counter()
        result = sched.cycle(now)
        times.append(time.perf_counter() - t0)
        decisions += len(result.decisions)
        for d in result.decisions:
            if isinstance(d, Preempt) and d.grace_s > 0:
                stops_due[d.job_id] = now + sched.notice_s(d.grace_s)
        now += 5.0
    times.sort()
    return {
        "policy": policy,
        "gpus": sched.cluster.total_gpus,
        "running": len(sched.running),
        "pending": len(sched.queue),
        "cycles": cycles,
        "p50_cycle_ms": 1000 * statistics.median(times),
        "p99_cycle_ms": 1000 * times[int(0.99 * (len(times) - 1))],
        "decisions_per_s": decisions / sum(times),
    }


def placement_speedup(trials: int = 300, seed: int = 0) -> dict:
    """Indexed best-fit placement against a scan of every node, on a half-full `large` cluster."""
    sched = loaded_scheduler("arbiter", running=2500, pending=0, seed=seed)
    index = sched.index
    rng = random.Random(seed)
    reqs = [
        Request(rng.choice(sorted(index.max_size)), rng.choice((1, 2, 4, 8))) for _ in range(trials)
    ]

    def scan(req: Request):
        best = None
        for node in range(len(index.size)):
            if index.node_type[node] != req.gpu_type or index.free[node] < req.gpus:
                continue
            if best is None or index.free[node] < index.free[best]:
                if pick_gpus(
                    index.free_mask[node], index.size[node], index.domain[node], req.gpus, 1
                ):
                    best = node
        return best

    t0 = time.perf_counter()
    for r in reqs:
        place(index, r)
    indexed = time.perf_counter() - t0
    t0 = time.perf_counter()
    for r in reqs:
        scan(r)
    scanned = time.perf_counter() - t0
    return {
        "trials": trials,
        "indexed_us": 1e6 * indexed / trials,
        "scan_us": 1e6 * scanned / trials,
        "speedup": scanned / indexed,
    }


def sim_throughput(jobs: int, policies: tuple[str, ...] = ("arbiter", "backfill")) -> list[dict]:
    cluster = medium()
    workload = synthetic_workload(jobs, 0, cluster)
    out = []
    for policy in policies:
        t0 = time.perf_counter()
        result = simulate(cluster, synthetic_teams(cluster), policy, workload)
        wall = time.perf_counter() - t0
        out.append(
            {
                "policy": policy,
                "jobs": jobs,
                "completed": result.kpis["completed"],
                "cycles": result.kpis["cycles"],
                "wall_s": wall,
                "jobs_per_s": jobs / wall,
            }
        )
    return out
