"""Baselines under the one interface: FIFO blocks, backfill never preempts, Tiresias demotes by
attained service, Gavel re-plans every round."""

import pytest

from gpu_arbiter.domain import InvalidInput, Team
from gpu_arbiter.engine import EngineConfig, Scheduler, get_policy
from gpu_arbiter.engine.context import CycleView
from gpu_arbiter.engine.policies.arbiter import ArbiterPolicy
from gpu_arbiter.engine.policies.gavel import ROUND_S
from gpu_arbiter.engine.policies.tiresias import queue_of
from tests.conftest import job
from tests.engine.helpers import cluster, cycle, preempts, starts

TEAMS = [Team("a", quota={"H100": 8}), Team("b")]


def one_node():
    return cluster({"name": "r0", "nodes": 1})


def test_fifo_blocks_behind_the_head_of_the_line():
    sched = Scheduler(one_node(), policy="fifo")
    sched.submit(job("running", gpus=4, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("head", gpus=8), 1.0)
    sched.submit(job("small", gpus=1), 2.0)
    assert cycle(sched, 2.0) == []


def test_backfill_lets_the_small_job_past_but_never_preempts():
    sched = Scheduler(one_node(), policy="backfill")
    sched.submit(job("running", gpus=4, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("core", tier=1, gpus=8), 1.0)
    sched.submit(job("small", gpus=1, walltime_s=10.0), 2.0)
    decisions = cycle(sched, 2.0)
    assert set(starts(decisions)) == {"small"} and preempts(decisions) == {}


def test_tiresias_demotes_by_attained_service_and_preempts_lower_queues():
    sched = Scheduler(one_node(), policy="tiresias")
    sched.submit(job("old", gpus=8, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("new", gpus=8), 100.0)
    assert cycle(sched, 100.0) == []  # 800 GPU-s: still in the first queue
    sched.jobs["old"].advance(500.0)
    assert queue_of(sched.jobs["old"]) == 1
    decisions = cycle(sched, 500.0)
    order = preempts(decisions)["old"]
    # Tiresias suspends by saving: the save takes its minute, and the old job keeps everything.
    assert order.grace_s == sched.cfg.notice_stop_s == 60.0 and order.checkpoint
    assert "new" not in starts(decisions)
    sched.stopped("old", 560.0)
    assert sched.jobs["old"].progress_s == 560.0
    assert "new" in starts(cycle(sched, 560.0))


def test_tiresias_ranks_its_victims_without_walltime_estimates():
    """It knows nothing of estimates: "due" would end within the save minute by its estimate
    (Arbiter's first pick), but "fresh" has less unsaved work."""
    sched = Scheduler(one_node(), policy="tiresias")
    sched.submit(job("due", gpus=4, duration=1e5, walltime_s=1030.0), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("fresh", gpus=4, duration=1e5, walltime_s=1e5), 10.0)
    cycle(sched, 10.0)
    sched.submit(job("new", gpus=4), 1000.0)
    for running in ("due", "fresh"):
        sched.jobs[running].advance(1000.0)  # past 3,600 GPU-s: both in the second queue
    assert set(preempts(cycle(sched, 1000.0))) == {"fresh"}


def test_a_baseline_suspends_at_once_when_saves_take_no_time():
    sched = Scheduler(one_node(), policy="tiresias", config=EngineConfig(notice_stop_s=0.0))
    sched.submit(job("old", gpus=8, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("new", gpus=8), 100.0)
    sched.jobs["old"].advance(500.0)
    decisions = cycle(sched, 500.0)
    assert preempts(decisions)["old"].grace_s == 0 and "new" in starts(decisions)
    assert sched.jobs["old"].progress_s == 500.0


def test_tiresias_wakes_up_when_a_running_job_will_cross_a_threshold():
    sched = Scheduler(one_node(), policy="tiresias")
    sched.submit(job("old", gpus=8, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("new", gpus=8), 100.0)
    assert sched.cycle(100.0).next_wakeup == pytest.approx(3600.0 / 8, abs=1e-3)


def test_gavel_replans_every_round_and_swaps_the_least_served_job_in():
    sched = Scheduler(one_node(), policy="gavel")
    sched.submit(job("a", gpus=8, duration=1e5), 0.0)
    sched.submit(job("b", gpus=8, duration=1e5), 0.0)
    first = cycle(sched, 0.0)
    assert len(starts(first)) == 1
    (ran,) = starts(first)
    other = "b" if ran == "a" else "a"
    assert cycle(sched, ROUND_S / 2) == []  # no re-plan within a round
    decisions = cycle(sched, ROUND_S)
    assert preempts(decisions)[ran].grace_s == 60.0 and other not in starts(decisions)
    sched.stopped(ran, ROUND_S + 60.0)  # saved as its lease ended
    assert sched.jobs[ran].progress_s == ROUND_S + 60.0
    assert other in starts(cycle(sched, ROUND_S + 60.0))


def test_an_unknown_policy_is_refused_naming_the_choices():
    with pytest.raises(InvalidInput, match="unknown policy 'lottery'.*arbiter"):
        get_policy("lottery")


def test_gavel_plans_a_job_only_on_a_type_whose_nvlink_domains_fit_its_tp_groups():
    """Found by the completion property: Gavel planned a tp-2 job on the faster type, whose
    NVLink domains are single GPUs, and never started it; the scheduler now offers policies
    only the accepted types a job can run on."""
    c = cluster(
        {"name": "fast", "nodes": 1, "gpu_type": "H100", "nvlink_domain": 1},
        {"name": "slow", "nodes": 1, "gpu_type": "A100"},
    )
    sched = Scheduler(c, policy="gavel")
    sched.submit(job("tp", gpus=2, tp_size=2, gpu_types={"H100": 1.0, "A100": 0.87}), 0.0)
    assert starts(cycle(sched, 0.0))["tp"].allocation.gpu_type == "A100"


def test_policy_hooks_see_the_cycles_view_never_the_scheduler():
    """Every hook a cycle calls gets the cycle's `CycleView` (the narrow `SchedulerView`), also
    those called from deep in the walk and the preemption search, so a policy can reach no
    private member of the scheduler; its estimates answer for that cycle."""
    seen: dict[str, set[type]] = {}

    class Watching(ArbiterPolicy):
        pass

    def watch(name: str):
        inner = getattr(ArbiterPolicy, name)

        def hook(self, sched, *args):
            seen.setdefault(name, set()).add(type(sched))
            return inner(self, sched, *args)

        setattr(Watching, name, hook)

    hooks = (
        "ordered",
        "before_cycle",
        "after_walk",
        "next_wakeup",
        "candidate_types",
        "types_when_hopeless",
        "may_preempt",
        "may_have_victims",
        "victim_min_run",
        "preempt_key",
        "note_time",
    )
    for name in hooks:
        watch(name)
    c = cluster(
        {"name": "fast", "nodes": 1, "gpu_type": "H100"},
        {"name": "slow", "nodes": 1, "gpu_type": "V100"},
    )
    sched = Scheduler(c, TEAMS, policy=Watching())
    both = {"H100": 1.0, "V100": 0.5}
    for i in range(2):
        sched.submit(job(f"t3-{i}", team="b", gpus=8, gpu_types=both, walltime_s=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("core", team="a", tier=1, gpus=8, gpu_types=both, walltime_s=600.0), 10.0)
    sched.submit(job("late", team="b", gpus=8, gpu_types=both, walltime_s=1e5), 10.0)
    cycle(sched, 10.0)
    cycle(sched, 20.0)
    assert seen.keys() == set(hooks)
    assert all(types == {CycleView} for types in seen.values()), seen
