"""S9: an inference surge takes GPUs from offline training at once, and the simulator measures
how long the release took."""

from __future__ import annotations

import pytest

from gpu_arbiter.domain import (
    Cluster,
    InvalidInput,
    JobKind,
    JobState,
    Node,
    Preempt,
    Rack,
    Start,
    Team,
)
from gpu_arbiter.engine import Scheduler
from gpu_arbiter.sim import SimConfig, simulate
from tests.conftest import job


def two_nodes() -> Cluster:
    nodes = [Node("n0", "H100", 8, "r0"), Node("n1", "H100", 8, "r0")]
    return Cluster.build("two", nodes, [Rack("r0")])


def teams() -> list[Team]:
    """`serve` owns one node, `train` the other; nothing is in the elastic pool."""
    return [Team("serve", quota={"H100": 8}), Team("train", quota={"H100": 8})]


def inference(id: str, gpus: int = 8, tier: int = 2):
    return job(id, team="serve", tier=tier, gpus=gpus, kind=JobKind.INFERENCE, latency_slo_ms=50.0)


def test_a_surge_stops_tier_3_training_in_the_same_cycle_without_grace():
    sched = Scheduler(two_nodes(), teams())
    sched.submit(job("explore", team="train", tier=3, gpus=8, duration=1e5), 0.0)
    sched.submit(job("borrowing", team="train", tier=2, gpus=8, duration=1e5), 0.0)
    sched.cycle(0.0)
    sched.submit(inference("svc"), 10.0)
    decisions = sched.cycle(10.0).decisions
    stops = [d for d in decisions if isinstance(d, Preempt)]
    assert len(stops) == 1 and stops[0].grace_s == 0.0 and stops[0].for_job == "svc"
    assert "inference job svc" in stops[0].reason
    assert any(isinstance(d, Start) and d.job_id == "svc" for d in decisions)
    assert sched.jobs["svc"].state == JobState.RUNNING


def test_borrowed_tier_2_training_is_released_at_once_for_inference():
    sched = Scheduler(two_nodes(), teams())
    sched.submit(job("own", team="train", tier=2, gpus=8, duration=1e5), 0.0)
    sched.submit(job("borrowed", team="train", tier=2, gpus=8, duration=1e5), 0.0)
    sched.cycle(0.0)
    assert sched.jobs["borrowed"].borrowed
    sched.submit(inference("svc"), 10.0)
    (stop,) = [d for d in sched.cycle(10.0).decisions if isinstance(d, Preempt)]
    assert (stop.job_id, stop.grace_s) == ("borrowed", 0.0)
    assert sched.jobs["own"].state == JobState.RUNNING


def test_inference_never_takes_owned_tier_2_training_or_another_service():
    sched = Scheduler(two_nodes(), teams())
    sched.submit(job("own", team="train", tier=2, gpus=8, duration=1e5), 0.0)
    sched.submit(inference("svc-a"), 0.0)
    sched.cycle(0.0)
    sched.submit(inference("svc-b", tier=1), 10.0)
    assert not [d for d in sched.cycle(10.0).decisions if isinstance(d, Preempt)]
    assert sched.jobs["svc-b"].state == JobState.PENDING


def test_a_latency_slo_belongs_to_an_inference_job_and_must_be_positive():
    with pytest.raises(InvalidInput, match="inference jobs only"):
        job("t", latency_slo_ms=50.0)
    with pytest.raises(InvalidInput, match="latency_slo_ms must be > 0"):
        job("i", kind=JobKind.INFERENCE, latency_slo_ms=0.0)


def test_the_simulator_measures_the_release_latency_of_an_inference_surge():
    specs = [
        job("explore", team="train", tier=3, gpus=8, duration=1e5),
        job("borrowing", team="train", tier=2, gpus=8, duration=1e5),
        *(
            job(
                f"svc{i}",
                team="serve",
                tier=2,
                gpus=8,
                duration=3600.0,
                submit_s=100.0 + 10_000 * i,
                kind=JobKind.INFERENCE,
                latency_slo_ms=50.0,
            )
            for i in range(3)
        ),
    ]
    k = simulate(two_nodes(), teams(), "arbiter", specs, SimConfig(reliability=None)).kpis
    assert k["inference_jobs"] == 3 and k["inference_preemptions"] >= 1
    assert k["inference_p99_queue_delay_s"] == 0.0
    assert 0.0 < k["inference_release_p99_ms"] < 500.0  # S9: within 500 ms of the decision
