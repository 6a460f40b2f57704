"""S11: fractional-GPU jobs pack onto shared GPUs, best fit, never past one GPU's worth."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_arbiter.domain import Cluster, JobState, Node, Rack, Start, Team
from gpu_arbiter.domain.team import default_teams
from gpu_arbiter.engine import Scheduler
from gpu_arbiter.engine.preemption import shared_gpu_option
from tests.conftest import job
from tests.engine.helpers import cycle, preempts, starts


def one_node(gpus: int = 8) -> Scheduler:
    c = Cluster.build("one", [Node("n0", "H100", gpus, "r0")], [Rack("r0")])
    return Scheduler(c, default_teams(c.gpus_by_type(), {"a": 1.0}))


def started(sched: Scheduler, now: float = 0.0) -> dict[str, tuple[int, ...]]:
    return {
        d.job_id: d.allocation.slots[0][1]
        for d in sched.cycle(now).decisions
        if isinstance(d, Start)
    }


def test_seven_sevenths_share_one_gpu_and_an_eighth_opens_another():
    sched = one_node()
    for i in range(8):
        sched.submit(job(f"s{i}", gpu_milli=142), 0.0)
    gpus = started(sched)
    assert len(gpus) == 8
    assert sorted(gpus.values()).count((0,)) == 7
    assert sched.index.type_free["H100"] == 6  # two GPUs are shared, six wholly free


def test_a_fractional_job_goes_to_the_shared_gpu_with_the_least_room_that_fits():
    sched = one_node()
    sched.submit(job("a", gpu_milli=700), 0.0)  # GPU 0: 300 left
    sched.submit(job("b", gpu_milli=500, gpus=1), 0.0)  # does not fit GPU 0: opens GPU 1
    first = started(sched)
    assert first == {"a": (0,), "b": (1,)}
    sched.submit(job("c", gpu_milli=250), 1.0)
    assert started(sched, 1.0) == {"c": (0,)}  # 300 left beats 500 left


def test_whole_gpu_jobs_only_get_wholly_free_gpus():
    sched = one_node()
    sched.submit(job("tiny", gpu_milli=100), 0.0)
    sched.submit(job("seven", gpus=7), 0.0)
    sched.submit(job("all", gpus=8), 0.0)
    assert started(sched) == {"tiny": (0,), "seven": (1, 2, 3, 4, 5, 6, 7)}
    assert sched.jobs["all"].state == JobState.PENDING  # GPU 0 is only 1/10 used, not free


def test_the_last_tenant_out_gives_the_gpu_back():
    sched = one_node()
    sched.submit(job("a", gpu_milli=500), 0.0)
    sched.submit(job("b", gpu_milli=500), 0.0)
    started(sched)
    assert sched.index.type_free["H100"] == 7
    sched.finished("a", 10.0)
    assert sched.index.type_free["H100"] == 7
    sched.finished("b", 20.0)
    assert sched.index.type_free["H100"] == 8 and not sched.shared.used


def test_a_fractional_job_holds_only_its_share_of_gpu_time():
    sched = one_node()
    sched.submit(job("q", gpu_milli=250, duration=100.0), 0.0)
    started(sched)
    done = sched.finished("q", 100.0)
    assert done.busy_gpu_s == 25.0 and done.useful_gpu_s == 25.0


def test_fractional_jobs_use_their_share_of_the_teams_quota():
    """S2 with S11: four quarter-GPU pods fill a one-GPU guarantee, so none of them runs on
    borrowed capacity (counted as whole GPUs, three would) and the fifth does."""
    c = Cluster.build("one", [Node("n0", "H100", 8, "r0")], [Rack("r0")])
    sched = Scheduler(c, [Team("a", quota={"H100": 1}), Team("b", quota={"H100": 6})])
    for i in range(5):
        sched.submit(job(f"q{i}", tier=2, gpu_milli=250), 0.0)
    assert len(started(sched)) == 5
    assert [sched.jobs[f"q{i}"].borrowed for i in range(5)] == [False] * 4 + [True]


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(1, 999), st.integers(0, 40)), max_size=60))
def test_no_gpu_is_ever_booked_past_a_thousand_milli(ops):
    sched = one_node(gpus=2)
    running: list[str] = []
    now = 0.0
    for i, (submit, milli, pick) in enumerate(ops):
        now += 1.0
        if submit or not running:
            sched.submit(job(f"j{i}", gpu_milli=milli), now)
        else:
            sched.finished(running.pop(pick % len(running)), now)
        sched.cycle(now)
        running = [j.id for j in sched.running.values()]
        booked: dict[tuple[int, int], int] = {}
        for j in sched.running.values():
            ((node, (gpu,)),) = j.allocation.slots
            booked[(node, gpu)] = booked.get((node, gpu), 0) + j.spec.gpu_milli
        assert all(v <= 1000 for v in booked.values())
        assert booked == sched.shared.used
        assert sched.index.type_free["H100"] == 2 - len(booked)


def test_a_tier1_job_stops_the_tier3_jobs_sharing_a_gpu_at_once_and_starts_in_the_cycle():
    """S1 with S11: tier-3 pods that share the only GPU are suspended together for a tier-1
    job; one of them alone would free nothing. (On Alibaba v2023, where most tier-3 pods are
    fractional, tier-1 pods waited a minute for a tier-2 victim's save instead.)"""
    sched = one_node(gpus=1)
    sched.submit(job("s1", tier=3, gpu_milli=500, duration=1e5), 0.0)
    sched.submit(job("s2", tier=3, gpu_milli=300, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("core", tier=1, duration=1e5), 600.0)
    decisions = cycle(sched, 600.0)
    assert set(preempts(decisions)) == {"s1", "s2"}
    assert all(p.grace_s == 0 and p.for_job == "core" for p in preempts(decisions).values())
    assert "core" in starts(decisions) and not sched.shared.used


def test_a_gpu_shared_with_a_tier2_job_is_not_freed_at_once_and_its_tier3_job_keeps_running():
    sched = one_node(gpus=1)
    sched.submit(job("s3", tier=3, gpu_milli=500, duration=1e5), 0.0)
    sched.submit(job("s2", tier=2, gpu_milli=500, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("core", tier=1, duration=1e5), 600.0)
    assert not preempts(cycle(sched, 600.0))
    assert {"s2", "s3"} <= set(sched.running)


@pytest.mark.parametrize(("now", "save_s"), [(600.0, 0.0), (3000.0, 60.0)])
def test_tier3_jobs_sharing_a_gpu_stop_at_once_only_while_their_unsaved_work_is_small(now, save_s):
    """Two pods without checkpoints: after 10 min each they would lose 20 min together, so
    they stop at once; after 50 min each, 100 min (over `shared_stop_max_unsaved_s`, 1 h), so
    they save first, in the minute a save takes, as a whole tier-3 job would. Either way the
    tier-2 job on the other GPU keeps running (S1: tier 3 goes first). Before, pods past the
    cap were nobody's victims: on Alibaba's gpuspec33 a tier-1 pod waited 70 min beside one."""
    sched = one_node(gpus=2)
    sched.submit(job("biz", tier=2, duration=1e5), 0.0)
    sched.submit(job("s1", tier=3, gpu_milli=500, duration=1e5), 0.0)
    sched.submit(job("s2", tier=3, gpu_milli=500, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("core", tier=1, duration=1e5), now)
    stops = preempts(cycle(sched, now))
    assert set(stops) == {"s1", "s2"}
    assert all(p.grace_s == save_s and p.checkpoint == (save_s > 0) for p in stops.values())
    assert ("core" in sched.running) == (save_s == 0)


def test_a_shared_gpu_whose_jobs_save_for_a_tier1_job_takes_no_newcomer_and_goes_to_it():
    """While the pods save, the GPU they share is closed: a new pod that would fit beside
    them opens another GPU, and the tier-1 job starts on theirs once both have stopped."""
    sched = one_node(gpus=2)
    sched.submit(job("s1", tier=3, gpu_milli=400, duration=1e5), 0.0)
    sched.submit(job("s2", tier=3, gpu_milli=400, duration=1e5), 0.0)
    sched.submit(job("biz", tier=2, duration=1e5), 0.0)
    cycle(sched, 0.0)
    (shared,) = sched.shared.used
    sched.submit(job("core", tier=1, duration=1e5), 3000.0)
    assert set(preempts(cycle(sched, 3000.0))) == {"s1", "s2"}
    sched.submit(job("pod", tier=3, gpu_milli=200, duration=1e5), 3010.0)
    cycle(sched, 3010.0)
    assert sched.jobs["pod"].state == JobState.PENDING  # room left on GPU 0, but closed
    sched.stopped("s1", 3040.0)
    sched.stopped("s2", 3050.0)
    assert sched.jobs["core"].allocation.slots == ((shared[0], (shared[1],)),)
    assert not sched.shared.closed


def test_a_tier2_job_gives_the_tier3_pods_sharing_a_gpu_their_save_minute():
    """Tier-3 victims of a tier-2 job save first, in the minute a save takes; pods sharing a
    GPU do so together, and the GPU goes to the tier-2 job once they have. Before, shared GPUs
    were victims only of stops at once, and the tier-2 job waited for the pods to end."""
    sched = one_node(gpus=1)
    sched.submit(job("s1", tier=3, gpu_milli=500, duration=1e5), 0.0)
    sched.submit(job("s2", tier=3, gpu_milli=500, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("biz", tier=2, duration=1e5), 600.0)
    stops = preempts(cycle(sched, 600.0))
    assert set(stops) == {"s1", "s2"}
    assert all(p.grace_s == 60.0 and p.checkpoint and p.for_job == "biz" for p in stops.values())
    sched.stopped("s1", 640.0)
    assert "biz" not in sched.running  # s2 still on the GPU
    sched.stopped("s2", 650.0)
    assert "biz" in sched.running and sched.jobs["s1"].progress_s > 0


@pytest.mark.parametrize("by_estimates", [True, False])
def test_a_shared_gpu_option_reads_walltime_estimates_only_for_policies_that_do(by_estimates):
    """Given a minute's notice, pods whose estimates say they end in 30 s hold the GPU that
    long; a policy that reads no estimates (Tiresias) counts the whole minute, and ranks them
    by the work they would lose, as it does whole jobs (`victim_options`)."""
    sched = one_node(gpus=1)
    sched.submit(job("s1", gpu_milli=500, duration=630.0, walltime_s=630.0), 0.0)
    sched.submit(job("s2", gpu_milli=500, duration=600.0, walltime_s=600.0), 0.0)
    cycle(sched, 0.0)
    sharers = tuple(sched.running[j] for j in ("s1", "s2"))
    option = shared_gpu_option(sharers, 300.0, 60.0, 600.0, 3600.0, None, by_estimates)
    assert option is not None and not option.at_once
    wait, cost = option.key[1:3]
    if by_estimates:
        assert wait == pytest.approx(30.0) and cost == pytest.approx(-30.0)
    else:
        assert wait == 60.0 and cost == pytest.approx(1200.0)
