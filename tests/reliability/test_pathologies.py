"""Synthetic telemetry: deterministic, healthy until the onset, caught by the right breaker."""

import math
from itertools import islice

import pytest

from gpu_arbiter.reliability import Breaker, BreakerConfig, Pathology, detect, telemetry_stream

EXPECTED = {
    Pathology.NAN_LOSS: Breaker.NON_FINITE,
    Pathology.GRAD_EXPLOSION: Breaker.GRAD_EXPLOSION,
    Pathology.DIVERGENCE: Breaker.LOSS_DIVERGENCE,
    Pathology.IO_STALL: Breaker.IO_STALL,
}


@pytest.mark.parametrize("kind", list(EXPECTED))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_pathology_is_caught_by_its_breaker_soon_after_the_onset(kind, seed):
    found = detect(kind, seed, interval_s=60.0, onset_s=7200.0)
    assert found.breaker is EXPECTED[kind]
    assert 7200.0 <= found.at <= 7200.0 + 3600.0


def test_the_healthy_run_is_never_caught():
    assert all(detect(Pathology.HEALTHY, seed, interval_s=30.0) is None for seed in range(4))


def test_detection_follows_the_configuration():
    loose = BreakerConfig(io_window_s=1800.0)
    assert detect(Pathology.IO_STALL, 0).at == 3600.0 + 600.0
    assert detect(Pathology.IO_STALL, 0, config=loose).at == 3600.0 + 1800.0


def test_streams_are_deterministic_and_longer_ones_extend_shorter_ones():
    short = list(telemetry_stream(Pathology.DIVERGENCE, 5, 3600.0, 10.0))
    long = list(telemetry_stream(Pathology.DIVERGENCE, 5, 36000.0, 10.0))
    assert len(short) == 361 and len(long) == 3601
    assert long[:361] == short
    assert [s.at for s in short[:3]] == [0.0, 10.0, 20.0]
    assert [s.step for s in short[:3]] == [0, 1, 2]


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_a_pathology_is_the_healthy_run_until_its_onset(kind):
    healthy = telemetry_stream(Pathology.HEALTHY, 9, 7200.0, 60.0, onset_s=3600.0)
    sick = telemetry_stream(kind, 9, 7200.0, 60.0, onset_s=3600.0)
    pairs = list(zip(healthy, sick, strict=True))
    assert all(h == s for h, s in pairs if h.at < 3600.0)
    assert all(h != s for h, s in pairs if h.at > 3600.0)


def test_the_healthy_loss_falls_and_stays_finite_and_in_range():
    samples = list(telemetry_stream(Pathology.HEALTHY, 0, 48 * 3600.0, 300.0))
    assert samples[0].loss > 8 and samples[-1].loss < 3.5
    for s in samples:
        assert math.isfinite(s.loss) and s.loss > 0 and s.grad_norm > 0
        assert 0 <= s.io_wait_share < 0.15
        assert s.tokens_per_s > 0 and s.flops > 0


def test_a_stream_is_lazy():
    first = list(islice(telemetry_stream(Pathology.HEALTHY, 0, 1e9, 1.0), 3))
    assert len(first) == 3


def test_the_domain_names_the_same_pathologies_as_the_generator():
    from gpu_arbiter.domain import PATHOLOGIES

    assert set(PATHOLOGIES) == {p.value for p in Pathology} - {Pathology.HEALTHY.value}
