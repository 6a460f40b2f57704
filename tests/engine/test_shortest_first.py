"""Shortest remaining time first within tier 3 (`ArbiterPolicy.may_preempt`): a tier-3 job may
stop a tier-3 job with at least `stop_longer` (8) times as long left, which saves first."""

from gpu_arbiter.domain import Team
from gpu_arbiter.engine import Scheduler
from gpu_arbiter.engine.context import CycleContext, CycleView
from gpu_arbiter.engine.policies.arbiter import ArbiterPolicy
from tests.conftest import job
from tests.engine.helpers import cluster, cycle, preempts, starts


def nodes(n: int):
    return cluster({"name": "r0", "nodes": n, "power_cap_kw": 40.0})


def test_a_short_tier3_job_stops_a_far_longer_one_which_saves_and_goes_back_in_line():
    sched = Scheduler(nodes(1))
    sched.submit(job("long", gpus=8, duration=1e5, walltime_s=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("short", gpus=8, duration=100.0, walltime_s=200.0), 10.0)
    order = preempts(cycle(sched, 10.0))["long"]
    assert order.for_job == "short" and order.checkpoint and order.grace_s == 60.0
    assert "shortest first" in order.reason
    assert "short" in sched.holds  # its GPUs wait for it while the victim saves
    sched.stopped("long", 70.0)
    assert "short" in starts(cycle(sched, 70.0))
    assert sched.jobs["long"].state.value == "pending"


def test_not_a_job_with_less_than_eight_times_as_long_left():
    sched = Scheduler(nodes(1))
    sched.submit(job("long", gpus=8, duration=1e5, walltime_s=2000.0), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("short", gpus=8, duration=100.0, walltime_s=300.0), 10.0)
    assert cycle(sched, 10.0) == []
    # Found without a search, by the victims' expected ends, and remembered until a job starts.
    assert sched.set_aside("short") == "hopeless"


def test_a_job_without_an_estimate_counts_as_running_for_ever_but_stops_nobody_itself():
    sched = Scheduler(nodes(1))
    sched.submit(job("unknown", gpus=8, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("also-unknown", gpus=8, duration=100.0), 10.0)
    assert cycle(sched, 10.0) == []
    sched.submit(job("short", gpus=8, duration=100.0, walltime_s=200.0), 20.0)
    assert list(preempts(cycle(sched, 20.0))) == ["unknown"]


def test_off_when_the_policy_says_so():
    sched = Scheduler(nodes(1), (), ArbiterPolicy(stop_longer=None))
    sched.submit(job("long", gpus=8, duration=1e5, walltime_s=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("short", gpus=8, duration=100.0, walltime_s=200.0), 10.0)
    assert cycle(sched, 10.0) == []


def two_teams(a_walltime: float, b_walltime: float) -> Scheduler:
    """A full cluster: team a runs one 8-GPU job, team b two (so b is served more)."""
    sched = Scheduler(nodes(3))
    sched.submit(job("a-run", team="a", gpus=8, duration=1e5, walltime_s=a_walltime), 0.0)
    for i in (1, 2):
        sched.submit(job(f"b-run{i}", team="b", gpus=8, duration=1e5, walltime_s=b_walltime), 0.0)
    cycle(sched, 0.0)
    return sched


def test_a_team_served_less_keeps_its_jobs():
    sched = two_teams(a_walltime=1e5, b_walltime=1000.0)  # only a's job runs long
    sched.submit(job("b-short", team="b", gpus=8, duration=100.0, walltime_s=200.0), 10.0)
    assert cycle(sched, 10.0) == []
    sched = two_teams(a_walltime=1000.0, b_walltime=1e5)  # only b's jobs run long
    sched.submit(job("a-short", team="a", gpus=8, duration=100.0, walltime_s=200.0), 10.0)
    assert list(preempts(cycle(sched, 10.0))) in (["b-run1"], ["b-run2"])


def test_a_job_beyond_its_quota_stops_borrowers_but_not_guaranteed_jobs():
    """On 32 GPUs a is guaranteed 8 and b 16: a is at its guarantee, b runs two jobs within its
    guarantee and one borrowed. a's short job may take only the borrowed one, though b, with
    as many GPUs as a after it, is served no less."""
    teams = [Team("a", quota={"H100": 8}), Team("b", quota={"H100": 16})]
    sched = Scheduler(nodes(4), teams)
    sched.submit(job("a-own", team="a", tier=2, gpus=8, duration=1e5), 0.0)
    for i in (1, 2):
        sched.submit(job(f"b-own{i}", team="b", gpus=8, duration=1e5, walltime_s=1e5), 0.0)
    sched.submit(job("b-borrow", team="b", gpus=8, duration=1e5, walltime_s=1e5), 1.0)
    cycle(sched, 1.0)
    assert sched.jobs["b-borrow"].borrowed and not sched.jobs["b-own1"].borrowed
    sched.submit(job("a-short", team="a", gpus=8, duration=100.0, walltime_s=200.0), 10.0)
    assert list(preempts(cycle(sched, 10.0))) == ["b-borrow"]
    sched.stopped("b-borrow", 70.0)
    assert "a-short" in starts(cycle(sched, 70.0))
    sched.submit(job("a-short2", team="a", gpus=8, duration=100.0, walltime_s=200.0), 80.0)
    assert cycle(sched, 80.0) == []  # b's guaranteed jobs are not a borrower's to take


def test_failed_searches_are_shared_by_jobs_of_one_band_of_time_left_only():
    """A search's signature holds the job's time left, rounded down to a power of two, so a
    longer job's failure is never taken for a shorter one's."""
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
    assert ArbiterPolicy(stop_longer=None).preempt_key(view, sched.jobs["w300"], "H100") is None


def test_a_job_set_aside_wakes_only_for_tier3_starts_that_run_long_enough_to_be_victims():
    """`short` (300 s estimate, so victims must run past 8 x 256 s from now) finds none:
    `a` ends too soon and team b's tier-2 job is no victim of tier 3. A 100-s tier-3 start can
    never be its victim and leaves it set aside; a start expected to run longer than that
    horizon sends it through a try again."""
    sched = Scheduler(nodes(2))
    sched.submit(job("a", gpus=8, duration=1e5, walltime_s=2000.0), 0.0)
    sched.submit(job("b", team="b", tier=2, gpus=4, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("short", gpus=8, duration=100.0, walltime_s=300.0), 10.0)
    assert cycle(sched, 10.0) == []
    assert sched.set_aside("short") == "hopeless"

    sched.submit(job("quick", gpus=2, duration=100.0, walltime_s=100.0), 20.0)
    assert "quick" in starts(cycle(sched, 20.0))
    sched.submit(job("longer", gpus=2, duration=1e5, walltime_s=1e5), 30.0)
    assert "longer" in starts(cycle(sched, 30.0))
    assert sched.last_try["short"] == 10.0  # woken by neither the submission nor quick's start
    cycle(sched, 40.0)
    assert sched.last_try["short"] == 40.0  # longer runs past its horizon: a victim, if too few
    assert sched.set_aside("short") == "hopeless"
