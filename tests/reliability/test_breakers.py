"""F5: each breaker fires on the telemetry it guards against, and not on a healthy run."""

import math

import pytest

from gpu_arbiter.domain import InvalidInput
from gpu_arbiter.reliability import (
    Action,
    Breaker,
    BreakerConfig,
    BreakerPolicy,
    CircuitBreakers,
    Pathology,
    Telemetry,
    first_detection,
    mfu,
    telemetry_stream,
)


def sample(i, loss=2.0, grad=1.0, io=0.05, job="j", interval=60.0):
    return Telemetry(job, i * interval, i, loss, grad, io, 1000.0)


def stream(losses=None, grads=None, ios=None, interval=60.0):
    n = len(losses or grads or ios)
    losses = losses or [2.0] * n
    grads = grads or [1.0] * n
    ios = ios or [0.05] * n
    return [
        sample(i, lo, g, io, interval=interval)
        for i, (lo, g, io) in enumerate(zip(losses, grads, ios, strict=True))
    ]


CFG = BreakerConfig()


@pytest.mark.parametrize(("loss", "grad"), [(math.nan, 1.0), (math.inf, 1.0), (2.0, math.inf)])
def test_a_non_finite_loss_or_gradient_trips_at_once(loss, grad):
    found = first_detection([sample(0), sample(1, loss, grad)], CFG)
    assert found.breaker is Breaker.NON_FINITE
    assert found.step == 1
    assert "at step 1" in found.reason


def test_a_sustained_gradient_explosion_trips_after_the_configured_samples():
    grads = [1.0] * 20 + [50.0] * 5
    found = first_detection(stream(grads=grads), CFG)
    assert found.breaker is Breaker.GRAD_EXPLOSION
    assert found.step == 22  # the third sample over 10x the median
    assert "10x its running median 1" in found.reason


def test_brief_gradient_spikes_do_not_trip():
    grads = ([1.0] * 20 + [50.0, 50.0]) * 5
    assert first_detection(stream(grads=grads), CFG) is None


def test_an_absolute_gradient_limit_trips_even_before_the_median_is_known():
    cfg = BreakerConfig(grad_limit=100.0, grad_samples=2)
    found = first_detection(stream(grads=[500.0, 500.0]), cfg)
    assert found.breaker is Breaker.GRAD_EXPLOSION
    assert "above the limit 100" in found.reason


def test_a_diverging_loss_trips_the_divergence_breaker():
    losses = [3.0 - 0.01 * i for i in range(100)] + [2.0 * 1.05**i for i in range(60)]
    found = first_detection(stream(losses=losses), CFG)
    assert found.breaker is Breaker.LOSS_DIVERGENCE
    assert found.step > 100
    assert "above its best" in found.reason


def test_a_loss_spike_that_recovers_does_not_trip_the_divergence_breaker():
    losses = [2.0] * 50 + [4.0] * 3 + [2.0] * 50
    assert first_detection(stream(losses=losses), CFG) is None


@pytest.mark.parametrize("seed", range(8))
def test_a_healthy_noisy_run_trips_nothing(seed):
    assert first_detection(telemetry_stream(Pathology.HEALTHY, seed, 24 * 3600, 60), CFG) is None


def test_io_wait_above_the_limit_for_the_whole_window_trips():
    ios = [0.05] * 5 + [0.3] * 20
    found = first_detection(stream(ios=ios), CFG)
    assert found.breaker is Breaker.IO_STALL
    assert found.at == (5 + 10) * 60.0  # ten minutes after the first stalled sample
    assert "above 15% for 600 s (mean 30%)" in found.reason


def test_io_wait_that_dips_or_sits_at_the_limit_does_not_trip():
    ios = ([0.3] * 9 + [0.1]) * 5 + [0.15] * 30
    assert first_detection(stream(ios=ios), CFG) is None


def test_a_stop_policy_stops_the_job_once_and_then_ignores_it():
    cb = CircuitBreakers(default=BreakerPolicy(Action.STOP))
    assert cb.observe("t", sample(0)) is None
    trip = cb.observe("t", sample(1, loss=math.nan))
    assert trip.action is Action.STOP and trip.team == "t" and trip.at == 60.0
    assert trip.message.startswith("job j stopped and its GPUs released: loss is NaN")
    assert cb.observe("t", sample(2, loss=math.nan)) is None
    cb.forget("j")
    assert cb.observe("t", sample(3, loss=math.nan)) is not None


def test_a_flag_policy_flags_each_breaker_once_and_keeps_watching():
    cb = CircuitBreakers({"research": BreakerPolicy(Action.FLAG)})
    trips = [cb.observe("research", s) for s in stream(ios=[0.5] * 30)]
    io_trips = [t for t in trips if t]
    assert len(io_trips) == 1 and io_trips[0].action is Action.FLAG
    assert "flagged; it keeps running" in io_trips[0].message
    nan = cb.observe("research", sample(31, loss=math.nan))
    assert nan.detection.breaker is Breaker.NON_FINITE


def test_each_team_gets_its_own_policy_and_others_the_default():
    strict = BreakerPolicy(Action.FLAG, BreakerConfig(io_window_s=0.0))
    cb = CircuitBreakers({"strict": strict})
    assert cb.policy("strict") is strict
    assert cb.policy("other") == BreakerPolicy()
    assert cb.observe("strict", sample(0, io=0.5, job="a")).action is Action.FLAG
    assert cb.observe("other", sample(0, io=0.5, job="b")) is None


def test_mfu_is_achieved_over_peak_flops():
    assert mfu(4e15, 1e15, gpus=8) == 0.5
    with pytest.raises(InvalidInput):
        mfu(1.0, 0.0)


def test_bad_telemetry_and_configs_are_refused():
    with pytest.raises(InvalidInput):
        Telemetry("j", 0.0, 0, 1.0, 1.0, 1.5, 1.0)
    with pytest.raises(InvalidInput, match="grad_factor"):
        BreakerConfig(grad_factor=0.5)
