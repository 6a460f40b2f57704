"""Arbiter's discipline within tier 3 (`engine.discipline`): priority queues by attained
GPU-time, shortest remaining estimate within a queue, suspension of lower queues by checkpoint,
team fair share and quotas on whom a job may suspend, and reservations that bind only jobs of
the holder's queue or lower."""

import pytest

from gpu_arbiter.domain import Job, Team
from gpu_arbiter.engine import Scheduler, discipline
from gpu_arbiter.engine.context import CycleContext, CycleView
from gpu_arbiter.engine.policies.arbiter import ArbiterPolicy
from tests.conftest import job
from tests.engine.helpers import cluster, cycle, preempts, starts


def nodes(n: int):
    return cluster({"name": "r0", "nodes": n, "power_cap_kw": 40.0})


# 8 GPUs for 1000 s: 8000 GPU-seconds, past the first queue's 3600.
ATTAINED = 1000.0


def test_queues_by_attained_gpu_time_then_remaining_estimate_then_submission():
    def pending(id: str, attained: float, walltime: float | None, submit: float) -> Job:
        spec = job(id, gpus=2, duration=1e4, walltime_s=walltime, submit_s=submit)
        j = Job(spec, spec.tier)
        j.attained_gpu_s = attained
        return j

    jobs = [
        pending("served", 5000.0, 10.0, 0.0),  # shortest left, but it attained a queue's worth
        pending("unknown", 0.0, None, 0.0),
        pending("long", 0.0, 9000.0, 1.0),
        pending("short-late", 0.0, 100.0, 5.0),
        pending("short-early", 0.0, 100.0, 2.0),
    ]
    order = [j.id for j in sorted(jobs, key=discipline.rank_key)]
    assert order == ["short-early", "short-late", "long", "unknown", "served"]
    assert [discipline.queue_of(j) for j in jobs] == [1, 0, 0, 0, 0]


def test_a_job_without_an_estimate_suspends_one_that_attained_more_which_saves_first():
    sched = Scheduler(nodes(1))
    sched.submit(job("long", gpus=8, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("short", gpus=1, duration=100.0), ATTAINED)
    order = preempts(cycle(sched, ATTAINED))["long"]
    assert order.for_job == "short" and order.checkpoint and order.grace_s == 60.0
    assert "higher-priority queue" in order.reason
    assert "short" in sched.holds  # its GPUs wait for it while the victim saves
    sched.stopped("long", ATTAINED + 60.0)
    assert "short" in starts(cycle(sched, ATTAINED + 60.0))
    long = sched.jobs["long"]
    assert long.state.value == "pending" and long.progress_s > 0  # suspended, not restarted


def test_off_when_the_policy_says_so():
    sched = Scheduler(nodes(1), (), ArbiterPolicy(time_share=False))
    sched.submit(job("long", gpus=8, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("short", gpus=1, duration=100.0), ATTAINED)
    assert cycle(sched, ATTAINED) == []


def test_not_a_job_of_the_same_queue_until_it_attains_a_lower_one():
    """At 100 s the runner has 800 GPU-seconds, in the first queue too: the newcomer waits,
    set aside. At 450 s the runner has 3600, in the next queue: the cycle then sees the rise
    and sends the newcomer through a try again."""
    sched = Scheduler(nodes(1))
    sched.submit(job("long", gpus=8, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("short", gpus=1, duration=100.0), 100.0)
    assert cycle(sched, 100.0) == []
    assert sched.set_aside("short") == "hopeless"
    assert cycle(sched, 449.0) == []
    assert list(preempts(cycle(sched, 450.0))) == ["long"]


def test_a_job_set_aside_for_too_few_victims_is_tried_again_when_gpus_free_up():
    """Team a's 8-GPU job comes while a's 1-GPU job (in the second queue) and team b's fresh
    7-GPU job (in the first) fill the node: one GPU of victims for 8 missing, so it is set
    aside. When b's job ends, 7 GPUs are free and the one victim is enough: it is suspended in
    that cycle, though nothing a's releases or a rise would wake it for happened."""
    sched = Scheduler(nodes(1))
    sched.submit(job("a-long", team="a", gpus=1, duration=1e6), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("b-fresh", team="b", gpus=7, duration=500.0), 4000.0)
    assert "b-fresh" in starts(cycle(sched, 4000.0))
    sched.submit(job("a-gang", team="a", gpus=8, duration=100.0), 4001.0)
    assert cycle(sched, 4001.0) == []
    assert sched.set_aside("a-gang") == "hopeless"
    sched.finished("b-fresh", 4500.0)
    assert list(preempts(cycle(sched, 4500.0))) == ["a-long"]


def test_with_estimates_a_victim_with_more_left_by_a_power_of_two_band():
    sched = Scheduler(nodes(1))
    # 8 x (2000 - 1000 done) = 8000 GPU-seconds left against the new job's 800.
    sched.submit(job("running", gpus=8, duration=2000.0, walltime_s=2000.0), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("new", gpus=8, duration=100.0, walltime_s=100.0), ATTAINED)
    assert list(preempts(cycle(sched, ATTAINED))) == ["running"]


def test_with_estimates_not_a_victim_in_the_same_band():
    sched = Scheduler(nodes(1))
    # 8 x (2500 - 1000 done) = 12000 GPU-seconds left, the new job's 8 x 1800 = 14400: one band.
    sched.submit(job("running", gpus=8, duration=2500.0, walltime_s=2500.0), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("new", gpus=8, duration=1800.0, walltime_s=1800.0), ATTAINED)
    assert cycle(sched, ATTAINED) == []


def test_tier3_never_suspends_tier2_and_tier1_still_stops_tier3():
    sched = Scheduler(nodes(1))
    sched.submit(job("t2", tier=2, gpus=8, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("short", gpus=1, duration=100.0), ATTAINED)
    assert cycle(sched, ATTAINED) == []

    sched = Scheduler(nodes(1))
    sched.submit(job("t3", gpus=8, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("t1", tier=1, gpus=8, duration=100.0), 10.0)  # t3 is in the first queue
    assert list(preempts(cycle(sched, 10.0))) == ["t3"]


def two_teams() -> Scheduler:
    """A full cluster: team a runs one 8-GPU job, team b two (so b is served more)."""
    sched = Scheduler(nodes(3))
    sched.submit(job("a-run", team="a", gpus=8, duration=1e5), 0.0)
    for i in (1, 2):
        sched.submit(job(f"b-run{i}", team="b", gpus=8, duration=1e5), 0.0)
    cycle(sched, 0.0)
    return sched


def test_a_team_served_less_keeps_its_jobs():
    sched = two_teams()
    sched.submit(job("b-short", team="b", gpus=8, duration=100.0), ATTAINED)
    assert list(preempts(cycle(sched, ATTAINED))) in (["b-run1"], ["b-run2"])  # its own only
    sched = two_teams()
    sched.submit(job("a-short", team="a", gpus=8, duration=100.0), ATTAINED)
    assert list(preempts(cycle(sched, ATTAINED))) in (["a-run"], ["b-run1"], ["b-run2"])


def test_a_job_beyond_its_quota_suspends_borrowers_but_not_guaranteed_jobs():
    """On 32 GPUs a is guaranteed 8 and b 16: a is at its guarantee, b runs two jobs within its
    guarantee and one borrowed. a's short job may take only the borrowed one, though b, with
    as many GPUs as a after it, is served no less."""
    teams = [Team("a", quota={"H100": 8}), Team("b", quota={"H100": 16})]
    sched = Scheduler(nodes(4), teams)
    sched.submit(job("a-own", team="a", tier=2, gpus=8, duration=1e5), 0.0)
    for i in (1, 2):
        sched.submit(job(f"b-own{i}", team="b", gpus=8, duration=1e5), 0.0)
    sched.submit(job("b-borrow", team="b", gpus=8, duration=1e5), 1.0)
    cycle(sched, 1.0)
    assert sched.jobs["b-borrow"].borrowed and not sched.jobs["b-own1"].borrowed
    sched.submit(job("a-short", team="a", gpus=8, duration=100.0), ATTAINED)
    assert list(preempts(cycle(sched, ATTAINED))) == ["b-borrow"]
    sched.stopped("b-borrow", ATTAINED + 60.0)
    assert "a-short" in starts(cycle(sched, ATTAINED + 60.0))
    sched.submit(job("a-short2", team="a", gpus=8, duration=100.0), ATTAINED + 70.0)
    assert cycle(sched, ATTAINED + 70.0) == []  # b's guaranteed jobs are not a borrower's


def test_failed_searches_are_shared_by_jobs_of_one_queue_and_band_only():
    sched = Scheduler(nodes(1))
    sched.submit(job("running", gpus=8, duration=1e5, walltime_s=1e5), 0.0)
    cycle(sched, 0.0)
    for name, walltime in (("w300", 300.0), ("w400", 400.0), ("w600", 600.0)):
        sched.submit(job(name, gpus=8, duration=100.0, walltime_s=walltime), 10.0)
    view = CycleView(sched, CycleContext(now=10.0))  # what the policy sees in a cycle at 10 s
    key = {
        j: sched.policy.preempt_key(view, sched.jobs[j], "H100") for j in ("w300", "w400", "w600")
    }
    assert key["w300"] == key["w400"] != key["w600"]
    assert ArbiterPolicy(time_share=False).preempt_key(view, sched.jobs["w300"], "H100") is None


@pytest.mark.parametrize("time_share", [True, False])
def test_a_reservation_binds_only_jobs_of_its_holders_queue_or_lower(time_share):
    """A 16-GPU gang of team a, suspended for a tier-1 job after it attained 16000 GPU-seconds,
    waits for the tier-1 job to end and reserves the type. Team b's fresh 4-GPU job, in a
    higher queue, could suspend the gang once it ran: it takes the free GPUs now."""
    seen = set()

    class Watching(ArbiterPolicy):
        def passes_reservation(self, sched, job, holder):
            seen.add(type(sched))
            return super().passes_reservation(sched, job, holder)

    sched = Scheduler(nodes(2), (), Watching(time_share=time_share))
    sched.submit(job("gang", gpus=16, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("core", team="c", tier=1, gpus=8, duration=2000.0, walltime_s=2000.0), 1e3)
    assert "gang" in preempts(cycle(sched, 1e3))
    sched.stopped("gang", 1060.0)
    assert "core" in starts(cycle(sched, 1060.0))
    sched.submit(job("small", team="b", gpus=4, duration=1e4, walltime_s=1e4), 1100.0)
    assert ("small" in starts(cycle(sched, 1100.0))) == time_share
    assert seen == {CycleView}  # asked, with the cycle's view of the scheduler
