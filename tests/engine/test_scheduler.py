"""The scheduler's driver-facing life cycle: submit validation, cancel, node failures, and
the choice of a slower GPU type (S7, F2, E3)."""

import pytest

from gpu_arbiter.domain import Allocation, InvalidInput, JobState, Team, Tier
from gpu_arbiter.domain.presets import small
from gpu_arbiter.engine import EngineConfig, Scheduler
from tests.conftest import job
from tests.engine.helpers import cluster, cycle, starts


def mixed():
    return cluster(
        {"name": "fast", "nodes": 1, "gpu_type": "H100"},
        {"name": "slow", "nodes": 1, "gpu_type": "A100"},
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (job("huge", gpus=65), "needs 65 GPUs but at most 64"),
        (job("racked", gpus=40, max_racks=1), "within 1 rack"),
        (job("typed", gpu_types={"B200": 1.9}), "accepts GPU types B200"),
        (job("tp", gpus=16, tp_size=16), "tp_size 16 is larger than any NVLink domain"),
    ],
)
def test_a_job_that_can_never_run_is_refused_with_a_message_naming_the_problem(spec, message):
    sched = Scheduler(small())
    with pytest.raises(InvalidInput, match=message):
        sched.submit(spec, 0.0)
    assert spec.id not in sched.jobs and len(sched.queue) == 0


def test_a_duplicate_job_id_is_refused():
    sched = Scheduler(small())
    sched.submit(job("x"), 0.0)
    with pytest.raises(InvalidInput, match="'x' was already submitted"):
        sched.submit(job("x"), 1.0)


def test_cancelling_a_pending_job_takes_it_off_the_queue():
    sched = Scheduler(small())
    sched.submit(job("x"), 0.0)
    assert sched.cancel("x", 1.0).state == JobState.CANCELLED
    assert len(sched.queue) == 0 and cycle(sched, 1.0) == []


def test_cancelling_a_running_job_frees_its_gpus():
    sched = Scheduler(small())
    sched.submit(job("x", gpus=8), 0.0)
    cycle(sched, 0.0)
    sched.cancel("x", 10.0)
    assert sched.index.total_free == 64
    with pytest.raises(InvalidInput, match="already cancelled"):
        sched.cancel("x", 11.0)


def test_cancelling_a_preemptor_returns_the_gpus_held_for_it():
    sched = Scheduler(cluster({"name": "r0", "nodes": 1}))
    sched.submit(job("biz", team="b", tier=2, gpus=6, duration=1e5), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("core", tier=1, gpus=8), 1.0)
    cycle(sched, 1.0)
    assert sched.index.total_free == 0
    sched.cancel("core", 2.0)
    assert sched.index.total_free == 2 and not sched.holds
    cycle(sched, 2.0)


def test_a_node_failure_requeues_its_jobs_losing_exactly_the_work_since_the_checkpoint():
    sched = Scheduler(small())
    sched.submit(job("ck", tier=2, gpus=8, duration=1e5, checkpoint_interval_s=300.0), 0.0)
    cycle(sched, 0.0)
    node = sched.cluster.nodes[sched.jobs["ck"].allocation.nodes[0]].name
    assert sched.node_down(node, 1000.0) == ["ck"]
    ck = sched.jobs["ck"]
    assert ck.state == JobState.PENDING and ck.progress_s == 900.0
    assert ck.lost_gpu_s == pytest.approx(100.0 * 8)
    assert ck.tier == Tier.BUSINESS and ck.restarts == 1


def test_a_job_without_checkpoints_is_demoted_one_tier_after_a_failure():
    sched = Scheduler(small())
    sched.submit(job("raw", tier=2, gpus=8, duration=1e5), 0.0)
    cycle(sched, 0.0)
    node = sched.cluster.nodes[sched.jobs["raw"].allocation.nodes[0]].name
    sched.node_down(node, 1000.0)
    raw = sched.jobs["raw"]
    assert raw.progress_s == 0.0 and raw.tier == Tier.EXPLORATORY and raw.failure_demoted


def test_a_down_node_offers_nothing_until_it_is_up_again():
    sched = Scheduler(cluster({"name": "r0", "nodes": 1}))
    sched.node_down("r0-n00", 0.0)
    sched.submit(job("x", gpus=1), 0.0)
    assert cycle(sched, 0.0) == []
    sched.node_up("r0-n00", 10.0)
    assert "x" in starts(cycle(sched, 10.0))


def test_a_requeued_job_restarts_elsewhere_after_its_restore_time():
    sched = Scheduler(small())
    sched.submit(job("ck", gpus=8, duration=1000.0, checkpoint_interval_s=100.0), 0.0)
    cycle(sched, 0.0)
    node = sched.cluster.nodes[sched.jobs["ck"].allocation.nodes[0]].name
    sched.node_down(node, 250.0)
    assert "ck" in starts(cycle(sched, 250.0))
    ck = sched.jobs["ck"]
    assert ck.stalled_until == 250.0 + sched.cfg.restart_overhead_s
    assert node not in [sched.cluster.nodes[n].name for n in ck.allocation.nodes]


def test_a_flexible_job_takes_the_slower_type_when_pinned_jobs_want_the_fast_one():
    sched = Scheduler(mixed())
    sched.submit(job("busy", gpus=6, duration=1e5, gpu_types={"H100": 1.0}), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("pinned", gpus=4, gpu_types={"H100": 1.0}), 1.0)
    sched.submit(job("flex", gpus=2, gpu_types={"H100": 1.0, "A100": 0.87}), 1.0)
    assert starts(cycle(sched, 1.0))["flex"].allocation.gpu_type == "A100"


def test_a_flexible_job_gives_way_on_the_fast_type_only_to_pinned_jobs_of_its_tier_or_above():
    """pinned (tier 3) is walked after core (tier 1) anyway (S1), and core would run on the
    A100s for good (tier 1 never moves): core takes the H100s; a pinned tier-1 job it gives
    way to."""
    for pinned_tier, runs_on in ((3, "H100"), (1, "A100")):
        sched = Scheduler(mixed())
        sched.submit(job("busy", gpus=6, duration=1e5, gpu_types={"H100": 1.0}), 0.0)
        cycle(sched, 0.0)
        sched.submit(job("pinned", tier=pinned_tier, gpus=4, gpu_types={"H100": 1.0}), 1.0)
        sched.submit(job("core", tier=1, gpus=2, gpu_types={"H100": 1.0, "A100": 0.87}), 1.0)
        assert starts(cycle(sched, 1.0))["core"].allocation.gpu_type == runs_on


def three_types(a100_gpus: int, h200_gpus: int):
    return cluster(
        {"name": "fast", "nodes": 1, "gpu_type": "H100"},
        {"name": "a", "nodes": 1, "gpu_type": "A100", "gpus_per_node": a100_gpus},
        {"name": "h", "nodes": 1, "gpu_type": "H200", "gpus_per_node": h200_gpus},
    )


FLEX_SPEEDS = {"H100": 1.0, "A100": 0.9, "H200": 0.9}  # A100 and H200 equally fast for it


def test_a_flexible_job_kept_off_the_fast_type_takes_the_roomiest_equally_fast_one():
    """Not the first by name: a small type filled by flexible jobs is lost to the jobs that
    can run nowhere else (Alibaba's gpuspec pod lists)."""
    sched = Scheduler(three_types(a100_gpus=2, h200_gpus=8))
    sched.submit(job("busy", gpus=6, duration=1e5, gpu_types={"H100": 1.0}), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("pinned", gpus=4, gpu_types={"H100": 1.0}), 1.0)
    sched.submit(job("flex", gpus=2, gpu_types=FLEX_SPEEDS), 1.0)
    assert starts(cycle(sched, 1.0))["flex"].allocation.gpu_type == "H200"


def test_a_flexible_job_kept_off_the_fast_type_leaves_a_type_pinned_jobs_want_too():
    sched = Scheduler(three_types(a100_gpus=8, h200_gpus=2))
    sched.submit(job("busy", gpus=6, duration=1e5, gpu_types={"H100": 1.0}), 0.0)
    sched.submit(job("busy-a", gpus=4, duration=1e5, gpu_types={"A100": 1.0}), 0.0)
    cycle(sched, 0.0)
    sched.submit(job("pinned", gpus=4, gpu_types={"H100": 1.0}), 1.0)
    sched.submit(job("pinned-a", gpus=6, gpu_types={"A100": 1.0}), 1.0)
    sched.submit(job("flex", gpus=2, gpu_types=FLEX_SPEEDS), 1.0)
    assert starts(cycle(sched, 1.0))["flex"].allocation.gpu_type == "H200"


def test_a_flexible_job_takes_the_fast_type_when_nobody_needs_it():
    sched = Scheduler(mixed())
    sched.submit(job("flex", gpus=2, gpu_types={"H100": 1.0, "A100": 0.87}), 0.0)
    assert starts(cycle(sched, 0.0))["flex"].allocation.gpu_type == "H100"


def test_a_job_runs_at_its_speed_on_the_slower_type():
    sched = Scheduler(mixed())
    sched.submit(job("slow", gpus=8, gpu_types={"A100": 0.87}), 0.0)
    cycle(sched, 0.0)
    assert sched.jobs["slow"].rate == pytest.approx(0.87)


def test_a_tier1_job_is_tier1_only_where_its_quota_fits_a_type_it_can_run_on():
    """Found by the driver property: quota plus pool was checked on every accepted type, also
    one whose NVLink domains are smaller than the job's tp size, so a tier-1 job could keep its
    tier while being admissible only where it can never be placed, and wait forever."""
    c = cluster(
        {"name": "fast", "nodes": 1, "gpu_type": "H100"},
        {"name": "slow", "nodes": 8, "gpu_type": "A100", "gpus_per_node": 2, "nvlink_domain": 1},
    )
    teams = [Team("a", quota={"H100": 2, "A100": 2}), Team("b", quota={"H100": 2, "A100": 2})]
    spec = job("tp8", tier=1, gpus=8, tp_size=8, gpu_types={"H100": 1.0, "A100": 0.87})
    sched = Scheduler(c, teams, config=EngineConfig(tier1_borrows_at_tier2=False))
    assert sched.submit(spec, 0.0).tier == Tier.BUSINESS
    assert "tp8" in starts(cycle(sched, 0.0))
    sched = Scheduler(c, teams)  # queued at tier 1, it borrows the H100s at tier 2
    assert sched.submit(spec, 0.0).tier == Tier.CORE
    assert "tp8" in starts(cycle(sched, 0.0))
    assert sched.jobs["tp8"].borrows_at_tier2


def test_a_drained_node_keeps_its_jobs_takes_no_new_ones_and_comes_back():
    sched = Scheduler(small())
    sched.submit(job("a", gpus=8), 0.0)
    node = starts(cycle(sched, 0.0))["a"].allocation.nodes[0]
    name = sched.cluster.nodes[node].name
    sched.drain(name)
    assert sched.jobs["a"].state == JobState.RUNNING
    sched.finished("a", 10.0)
    sched.submit(job("b", gpus=8), 10.0)
    placed = starts(cycle(sched, 10.0))["b"].allocation.nodes
    assert node not in placed  # its GPUs are free, but it takes no new work
    sched.node_up(name, 20.0)
    assert sched.index.free[node] == 8


def test_a_drained_node_that_fails_still_stops_its_jobs():
    sched = Scheduler(small())
    sched.submit(job("a", gpus=8), 0.0)
    node = starts(cycle(sched, 0.0))["a"].allocation.nodes[0]
    name = sched.cluster.nodes[node].name
    sched.drain(name)
    assert sched.node_down(name, 5.0) == ["a"]
    assert sched.jobs["a"].state == JobState.PENDING


def test_restart_queues_a_running_job_again_from_its_checkpoint():
    sched = Scheduler(small())
    sched.submit(job("a", gpus=8, duration=10_000.0, checkpoint_interval_s=100.0), 0.0)
    cycle(sched, 0.0)
    a = sched.jobs["a"]
    progress = a.progress_at(250.0)
    kept = a.saved_progress(250.0, progress)
    assert 0 < kept < progress
    sched.restart("a", 250.0)
    assert (a.state, a.restarts, a.progress_s) == (JobState.PENDING, 1, kept)


def test_an_adopted_job_runs_on_its_gpus_without_a_start_decision():
    sched = Scheduler(mixed())
    a = sched.submit(job("a", gpus=2, gpu_types={"H100": 1.0}), 0.0)
    sched.adopt(a, Allocation("H100", ((0, (2, 3)),)), 0.0)
    assert a.state == JobState.RUNNING and sched.index.type_free["H100"] == 6
    b = sched.submit(job("b", gpus=1, gpu_types={"H100": 1.0}), 0.0)
    with pytest.raises(InvalidInput, match=r"GPUs \(3,\) of node 0 are not free"):
        sched.adopt(b, Allocation("H100", ((0, (3,)),)), 0.0)
    assert b.state == JobState.PENDING
    assert list(starts(cycle(sched, 1.0))) == ["b"]  # and nothing for the adopted job


def test_moved_gpus_are_booked_only_where_they_are_free():
    sched = Scheduler(mixed())
    sched.submit(job("a", gpus=2, gpu_types={"H100": 1.0}), 0.0)
    sched.submit(job("b", gpus=2, gpu_types={"H100": 1.0}), 0.0)
    cycle(sched, 0.0)
    a, b = sched.jobs["a"].allocation, sched.jobs["b"].allocation
    assert not sched.move_gpus("a", b)  # b holds them: nothing changes
    assert sched.jobs["a"].allocation is a
    free = [g for g in range(8) if not any(g in gs for _, gs in a.slots + b.slots)][:2]
    moved = Allocation("H100", ((a.slots[0][0], tuple(free)),))
    assert sched.move_gpus("a", moved)
    assert sched.jobs["a"].allocation == moved
    assert sched.index.free_mask[0] & sum(1 << g for g in free) == 0
