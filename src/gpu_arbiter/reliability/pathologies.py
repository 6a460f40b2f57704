"""Seeded synthetic telemetry for the simulator: a healthy run and the pathologies of F5.

The healthy run is an LLM-like job: a power-law loss curve from ~10 towards ~1.8 with
autocorrelated multiplicative noise and rare brief loss spikes, a decaying gradient norm with
noise and spikes, a few percent of I/O wait. A pathology is the same run (same seed, same
samples) until `onset_s`, then:

* NAN_LOSS: loss and gradient norm become NaN;
* GRAD_EXPLOSION: the gradient norm jumps 20x and keeps growing;
* DIVERGENCE: the loss grows exponentially (e-folding every 20 min), the gradient norm mildly;
* IO_STALL: I/O wait jumps to ~35 % and throughput drops with it.

Streams are prefix-stable: a longer `duration_s` only appends samples. So `detect` can run the
breakers on a stream that ends a few hours after the onset and the simulator can schedule the
trip as one event at `job start + detection.at`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from enum import StrEnum

import numpy as np

from gpu_arbiter.domain import InvalidInput
from gpu_arbiter.reliability.breakers import BreakerConfig, Detection, Telemetry, first_detection

FLOPS_PER_TOKEN = 6 * 8e9  # training FLOPs per token of the synthetic 8B-parameter model
TOKENS_PER_S = 350_000.0  # healthy throughput of the synthetic job
_CHUNK = 256  # samples drawn per numpy call; fixed, so streams stay prefix-stable


class Pathology(StrEnum):
    HEALTHY = "healthy"
    NAN_LOSS = "nan_loss"
    GRAD_EXPLOSION = "grad_explosion"
    DIVERGENCE = "divergence"
    IO_STALL = "io_stall"


def telemetry_stream(
    kind: Pathology,
    seed: int,
    duration_s: float,
    interval_s: float,
    onset_s: float = 3600.0,
    job_id: str = "synthetic",
) -> Iterator[Telemetry]:
    """Samples every `interval_s` from 0 up to `duration_s` (inclusive); sample `i` is at
    `i * interval_s` and reports step `i`. `onset_s` is when the pathology starts."""
    if not (interval_s > 0 and math.isfinite(interval_s)):
        raise InvalidInput(f"telemetry stream: interval_s must be > 0, got {interval_s}")
    if not (duration_s >= 0 and math.isfinite(duration_s)):
        raise InvalidInput(f"telemetry stream: duration_s must be >= 0, got {duration_s}")
    if not onset_s >= 0:
        raise InvalidInput(f"telemetry stream: onset_s must be >= 0, got {onset_s}")
    n = int(duration_s // interval_s) + 1
    return _stream(Pathology(kind), seed, n, interval_s, onset_s, job_id)


def detect(
    kind: Pathology,
    seed: int,
    interval_s: float = 60.0,
    onset_s: float = 3600.0,
    config: BreakerConfig | None = None,
    horizon_s: float = 6 * 3600.0,
) -> Detection | None:
    """When (seconds after the job's start) and why the breakers under `config` catch `kind`,
    looking up to `horizon_s` after the onset; None if they do not (always, for HEALTHY)."""
    stream = telemetry_stream(kind, seed, onset_s + horizon_s, interval_s, onset_s)
    return first_detection(stream, config or BreakerConfig())


def _stream(
    kind: Pathology, seed: int, n: int, interval_s: float, onset_s: float, job_id: str
) -> Iterator[Telemetry]:
    rng = np.random.default_rng(seed)
    ar = 0.0  # AR(1) state of the loss noise
    spike_left, spike = 0, 1.0
    for start in range(0, n, _CHUNK):
        z = rng.standard_normal((_CHUNK, 4))
        u = rng.random((_CHUNK, 2))
        for j in range(min(_CHUNK, n - start)):
            i = start + j
            t = i * interval_s
            decay = (1.0 + t / 1800.0) ** -0.5
            ar = 0.6 * ar + 0.02 * z[j, 0]
            if spike_left == 0 and u[j, 0] < 0.004:  # a benign spike of 1-3 samples
                spike_left, spike = 1 + int(u[j, 1] * 3), 1.1 + 0.3 * u[j, 1]
            mult = spike if spike_left else 1.0
            spike_left = max(0, spike_left - 1)
            loss = (1.8 + 8.2 * decay) * math.exp(ar) * mult
            grad = (0.4 + 2.0 * decay) * math.exp(0.25 * z[j, 1]) * mult**2
            io = min(1.0, max(0.0, 0.04 + 0.015 * z[j, 2]))
            if t >= onset_s:
                loss, grad, io = _pathology(kind, t - onset_s, loss, grad, io, z[j, 2])
            tokens = TOKENS_PER_S * (1.0 - io) * math.exp(0.02 * z[j, 3])
            yield Telemetry(
                job_id=job_id,
                at=t,
                step=i,
                loss=loss,
                grad_norm=grad,
                io_wait_share=io,
                tokens_per_s=tokens,
                flops=tokens * FLOPS_PER_TOKEN,
            )


def _pathology(
    kind: Pathology, dt: float, loss: float, grad: float, io: float, z_io: float
) -> tuple[float, float, float]:
    """The sample values `dt` seconds after the onset of `kind`."""
    if kind is Pathology.NAN_LOSS:
        return math.nan, math.nan, io
    if kind is Pathology.GRAD_EXPLOSION:
        return loss, grad * 20.0 * math.exp(dt / 600.0), io
    if kind is Pathology.DIVERGENCE:
        return loss * math.exp(dt / 1200.0), grad * (1.0 + dt / 3600.0), io
    if kind is Pathology.IO_STALL:
        return loss, grad, min(1.0, max(0.0, 0.35 + 0.05 * z_io))
    return loss, grad, io
