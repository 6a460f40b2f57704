"""Arbiter walks a team's pending jobs shortest first (GPU time left by the walltime estimate)."""

from gpu_arbiter.engine import Scheduler
from gpu_arbiter.engine.policies.arbiter import ArbiterPolicy
from tests.conftest import job
from tests.engine.helpers import cluster, cycle, starts


def contended(policy: ArbiterPolicy) -> Scheduler:
    """One 8-GPU node, busy; three tier-3 jobs of one team wait for it: a long one first, then
    a short one, then one without an estimate."""
    sched = Scheduler(cluster({"name": "r0", "nodes": 1}), policy=policy)
    sched.submit(job("busy", gpus=8, duration=100.0, walltime_s=3600.0), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("long", gpus=8, duration=1e5, walltime_s=1e5), 1.0)
    sched.submit(job("short", gpus=4, duration=600.0, walltime_s=3600.0), 2.0)
    sched.submit(job("unknown", gpus=4, duration=600.0), 3.0)
    cycle(sched, 3.0)
    return sched


def test_the_job_with_least_gpu_time_left_starts_first():
    sched = contended(ArbiterPolicy())
    sched.finished("busy", 100.0)
    # then "long" is blocked and reserves the node, so "unknown" (no end in sight) waits too
    assert set(starts(cycle(sched, 100.0))) == {"short"}


def test_a_stopped_job_ranks_by_what_is_left_of_it():
    policy = ArbiterPolicy()
    sched = contended(policy)
    half = sched.jobs["long"]
    half.progress_s = 0.99 * half.spec.duration_s  # 1000 s of 8 GPUs left: 8000 GPU-s
    assert policy.rank_key(half) < policy.rank_key(sched.jobs["short"])  # 4 x 3600 GPU-s


def test_without_shortest_first_a_team_keeps_submission_order():
    sched = contended(ArbiterPolicy(shortest_first=False))
    sched.finished("busy", 100.0)
    assert set(starts(cycle(sched, 100.0))) == {"long"}


def test_theplan_order_after_starts_is_the_order_a_fresh_plan_makes():
    """Jobs leaving the queue (they started) keep the others in the plan's order: the kept
    order must be the one a policy seeing the queue for the first time makes."""
    c = cluster(
        {"name": "fast", "nodes": 1, "gpu_type": "H100"},
        {"name": "slow", "nodes": 1, "gpu_type": "V100"},
    )
    policy = ArbiterPolicy()
    sched = Scheduler(c, policy=policy)
    for i, (tier, slow) in enumerate([(3, 0.5), (2, 0.25), (1, 0.9), (3, 0.1), (2, 0.5)]):
        spec = job(f"j{i}", tier=tier, gpus=8, gpu_types={"H100": 1.0, "V100": slow})
        sched.submit(spec, 0.0)  # queued only: no cycle runs
    first = [j.id for j in policy.plan_order(sched)]
    assert first == ["j2", "j3", "j1", "j4", "j0"]  # tier 1, then most to gain, then tier
    sched.queue.remove(sched.jobs["j3"])
    sched.queue.remove(sched.jobs["j2"])
    kept = [j.id for j in policy.plan_order(sched)]
    assert kept == [j.id for j in ArbiterPolicy().plan_order(sched)] == ["j1", "j4", "j0"]
    sched.submit(job("j5", gpus=8, gpu_types={"H100": 1.0, "V100": 0.2}), 1.0)
    assert [j.id for j in policy.plan_order(sched)] == ["j5", "j1", "j4", "j0"]


def test_no_plan_is_made_while_no_pending_job_fits_the_free_gpus_of_a_type(monkeypatch):
    """The comparative-advantage plan is skipped (its order not even made) when the free GPUs
    of every type are fewer than the smallest pending job needs; it is made once they are not."""
    c = cluster(
        {"name": "fast", "nodes": 1, "gpu_type": "H100"},
        {"name": "slow", "nodes": 1, "gpu_type": "V100"},
    )
    policy = ArbiterPolicy()
    sched = Scheduler(c, policy=policy)
    for name in ("a", "b"):
        sched.submit(job(name, gpus=6, gpu_types={"H100": 1.0, "V100": 0.5}, walltime_s=60.0), 0)
    assert set(starts(cycle(sched, 0.0))) == {"a", "b"}  # 2 GPUs of each type left free
    sched.submit(job("c", gpus=4, gpu_types={"H100": 1.0, "V100": 0.5}), 1.0)
    made = []
    plan_order = policy.plan_order
    monkeypatch.setattr(policy, "plan_order", lambda s: made.append(1) or plan_order(s))
    cycle(sched, 1.0)
    assert policy.plan == {} and not made
    sched.finished("a", 2.0)
    assert set(starts(cycle(sched, 2.0))) == {"c"} and policy.plan == {"c": "H100"} and made


def test_the_fast_type_goes_to_the_job_that_gains_most_over_the_type_it_would_get_instead():
    """The H100 and the A100 node are free, the V100 one too. x runs 1.33x faster on the H100
    than on the A100 (10x faster than on the V100), y 2.2x (5x). Against the A100, where the
    one left without the H100 goes, y gains more: it gets the H100. (Fastest over slowest
    gave it to x, and y ran at 0.45 instead of x at 0.75.)"""
    c = cluster(
        {"name": "h", "nodes": 1, "gpu_type": "H100"},
        {"name": "a", "nodes": 1, "gpu_type": "A100"},
        {"name": "v", "nodes": 1, "gpu_type": "V100"},
    )
    policy = ArbiterPolicy()
    sched = Scheduler(c, policy=policy)
    sched.submit(job("x", gpus=8, gpu_types={"H100": 1.0, "A100": 0.75, "V100": 0.1}), 0.0)
    sched.submit(job("y", gpus=8, gpu_types={"H100": 1.0, "A100": 0.45, "V100": 0.2}), 0.0)
    cycle(sched, 0.0)
    assert policy.plan == {"y": "H100", "x": "A100"}
    assert sched.jobs["y"].allocation.gpu_type == "H100"
    assert sched.jobs["x"].allocation.gpu_type == "A100"
