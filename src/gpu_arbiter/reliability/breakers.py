"""F5: circuit breakers that stop (or flag) a training job that is wasting its GPUs.

Four breakers watch each job's telemetry:

* non-finite loss or gradient norm: trips on the first such sample, nothing can recover it;
* gradient explosion: the gradient norm exceeds `grad_factor` × its running median (or an
  absolute `grad_limit`) for `grad_samples` samples in a row; one-off spikes are normal;
* loss divergence: an exponential moving average of the loss rises more than `divergence_share`
  above its lowest value for `divergence_samples` samples in a row; smoothing and the run keep
  per-step noise and brief loss spikes from tripping it;
* I/O stall: the I/O-wait share stays above `io_wait_limit` for `io_window_s` seconds (SPEC F5:
  15 %, sustained): the job is starving on data and holding GPUs idle.

Each job's breakers are independent state; a team's `BreakerPolicy` says whether a trip stops
the job (its GPUs are released) or only flags it. Either way the team gets `Trip.message`.
The simulator runs them over synthetic streams (`pathologies.detect`), the control plane over
every report a live job sends (`control.watch`): one implementation for both, and one count
of the GPU time a stop saves (`gpu_s_saved_by_stop`).
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gpu_arbiter.domain import InvalidInput, Job


@dataclass(frozen=True, slots=True)
class Telemetry:
    """One progress report from a job. `io_wait_share` is the fraction of wall time spent
    waiting for input (0..1); `flops` is the FLOP/s achieved by the whole job, when it says.
    A live job may leave out what it does not measure (None): the breakers that need it then
    skip the sample."""

    job_id: str
    at: float
    step: int
    loss: float | None
    grad_norm: float | None
    io_wait_share: float | None
    tokens_per_s: float | None
    flops: float | None = None

    def __post_init__(self) -> None:
        if self.io_wait_share is not None and not 0 <= self.io_wait_share <= 1:
            raise InvalidInput(
                f"telemetry of {self.job_id!r}: io_wait_share must be in 0..1, "
                f"got {self.io_wait_share}"
            )
        if self.step < 0:
            raise InvalidInput(f"telemetry of {self.job_id!r}: step must be >= 0, got {self.step}")


def mfu(flops: float, peak_flops_per_gpu: float, gpus: int = 1) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over the peak of the `gpus` GPUs it ran on
    (the peak of the GPU type, e.g. ~989e12 dense BF16 for an H100 SXM, is an input)."""
    if not peak_flops_per_gpu > 0:
        raise InvalidInput(f"mfu: peak_flops_per_gpu must be > 0, got {peak_flops_per_gpu}")
    if gpus < 1:
        raise InvalidInput(f"mfu: gpus must be >= 1, got {gpus}")
    if not flops >= 0:
        raise InvalidInput(f"mfu: flops must be >= 0, got {flops}")
    return flops / (peak_flops_per_gpu * gpus)


class Breaker(StrEnum):
    NON_FINITE = "non_finite"
    GRAD_EXPLOSION = "grad_explosion"
    LOSS_DIVERGENCE = "loss_divergence"
    IO_STALL = "io_stall"


class Action(StrEnum):
    STOP = "stop"  # stop the job and release its GPUs
    FLAG = "flag"  # keep it running, tell the team


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """Thresholds of the four breakers (see the module docstring). Sample counts, not times,
    for the loss and gradient breakers, because they reason about training steps; seconds for
    I/O, because SPEC F5 states the window in time."""

    grad_factor: float = 10.0
    grad_limit: float | None = None
    grad_samples: int = 3
    grad_window: int = 50  # samples in the running median
    grad_warmup: int = 10  # samples before the median is trusted
    divergence_share: float = 0.2
    divergence_alpha: float = 0.05  # EMA weight of a new sample
    divergence_samples: int = 5
    divergence_warmup: int = 20  # samples before the minimum is tracked
    io_wait_limit: float = 0.15
    io_window_s: float = 600.0

    def __post_init__(self) -> None:
        checks = {
            "grad_factor": self.grad_factor > 1,
            "grad_limit": self.grad_limit is None or self.grad_limit > 0,
            "grad_samples": self.grad_samples >= 1,
            "grad_window": self.grad_window >= 1,
            "grad_warmup": 1 <= self.grad_warmup <= self.grad_window,
            "divergence_share": self.divergence_share > 0,
            "divergence_alpha": 0 < self.divergence_alpha <= 1,
            "divergence_samples": self.divergence_samples >= 1,
            "divergence_warmup": self.divergence_warmup >= 1,
            "io_wait_limit": 0 <= self.io_wait_limit < 1,
            "io_window_s": self.io_window_s >= 0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise InvalidInput(f"breaker config: invalid {', '.join(bad)}")


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """What a team wants done when one of its jobs trips a breaker."""

    action: Action = Action.STOP
    config: BreakerConfig = field(default_factory=BreakerConfig)


@dataclass(frozen=True, slots=True)
class Detection:
    """A breaker fired on the sample at `at` (`step`); `reason` says what was seen."""

    breaker: Breaker
    at: float
    step: int
    reason: str


@dataclass(frozen=True, slots=True)
class Trip:
    """A detection turned into an action on `job_id` of `team`."""

    job_id: str
    team: str
    action: Action
    detection: Detection

    @property
    def at(self) -> float:
        return self.detection.at

    @property
    def reason(self) -> str:
        """The reason a stopped job carries (`arbiter queue`, GET /v1/jobs/{id})."""
        return f"circuit breaker: {self.detection.reason}"

    @property
    def message(self) -> str:
        """What the team is told."""
        what = (
            "stopped and its GPUs released"
            if self.action is Action.STOP
            else "flagged; it keeps running"
        )
        return f"job {self.job_id} {what}: {self.detection.reason}"


class _GradExplosion:
    """Gradient norm far above its running median (or an absolute limit), several times in a
    row. Samples over the threshold stay out of the median so an explosion cannot raise it."""

    __slots__ = ("cfg", "_order", "_sorted", "_run")

    def __init__(self, cfg: BreakerConfig) -> None:
        self.cfg = cfg
        self._order: deque[float] = deque()
        self._sorted: list[float] = []
        self._run = 0

    def update(self, g: float) -> str | None:
        cfg = self.cfg
        median = self._median() if len(self._sorted) >= cfg.grad_warmup else None
        over_limit = cfg.grad_limit is not None and g > cfg.grad_limit
        over_median = median is not None and g > cfg.grad_factor * median
        if not (over_limit or over_median):
            self._run = 0
            self._push(g)
            return None
        self._run += 1
        if self._run < cfg.grad_samples:
            return None
        if over_limit:
            why = f"above the limit {cfg.grad_limit:g}"
        else:
            why = f"over {cfg.grad_factor:g}x its running median {median:.3g}"
        return f"gradient explosion: gradient norm {g:.3g} {why} for {self._run} samples"

    def _median(self) -> float:
        s = self._sorted
        mid = len(s) // 2
        return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2

    def _push(self, g: float) -> None:
        self._order.append(g)
        insort(self._sorted, g)
        if len(self._order) > self.cfg.grad_window:
            old = self._order.popleft()
            del self._sorted[bisect_left(self._sorted, old)]


class _Divergence:
    """Smoothed loss well above its best value for a run of samples. Relative to the best value,
    so it suits positive losses (cross-entropy and the like)."""

    __slots__ = ("cfg", "_ema", "_seen", "_best", "_run")

    def __init__(self, cfg: BreakerConfig) -> None:
        self.cfg = cfg
        self._ema: float | None = None
        self._seen = 0
        self._best = math.inf
        self._run = 0

    def update(self, loss: float) -> str | None:
        cfg = self.cfg
        ema = loss if self._ema is None else self._ema + cfg.divergence_alpha * (loss - self._ema)
        self._ema = ema
        self._seen += 1
        if self._seen < cfg.divergence_warmup:
            return None
        if ema <= self._best:
            self._best = ema
            self._run = 0
            return None
        if ema - self._best <= cfg.divergence_share * abs(self._best):
            self._run = 0
            return None
        self._run += 1
        if self._run < cfg.divergence_samples:
            return None
        rise = (ema - self._best) / abs(self._best) if self._best else math.inf
        return (
            f"loss divergence: smoothed loss {ema:.4g} is {rise:.0%} above its best "
            f"{self._best:.4g} for {self._run} samples (limit {cfg.divergence_share:.0%})"
        )


class _IoStall:
    """I/O wait above the limit on every sample for a whole window."""

    __slots__ = ("cfg", "_since", "_sum", "_count")

    def __init__(self, cfg: BreakerConfig) -> None:
        self.cfg = cfg
        self._since: float | None = None
        self._sum = 0.0
        self._count = 0

    def update(self, at: float, share: float) -> str | None:
        cfg = self.cfg
        if share <= cfg.io_wait_limit:
            self._since = None
            return None
        if self._since is None:
            self._since, self._sum, self._count = at, 0.0, 0
        self._sum += share
        self._count += 1
        lasted = at - self._since
        if lasted < cfg.io_window_s:
            return None
        return (
            f"I/O stall: I/O wait above {cfg.io_wait_limit:.0%} for {lasted:g} s "
            f"(mean {self._sum / self._count:.0%}); the GPUs are starved of data"
        )


class JobBreakers:
    """The four breakers of one job. Each fires at most once; `observe` returns the first
    detection of a sample (non-finite values first: they would poison the other detectors)."""

    __slots__ = ("_grad", "_div", "_io", "_fired")

    def __init__(self, config: BreakerConfig) -> None:
        self._grad = _GradExplosion(config)
        self._div = _Divergence(config)
        self._io = _IoStall(config)
        self._fired: set[Breaker] = set()

    def observe(self, s: Telemetry) -> Detection | None:
        found: list[tuple[Breaker, str]] = []
        bad = [
            f"{name} is {_show(value)}"
            for name, value in (("loss", s.loss), ("gradient norm", s.grad_norm))
            if value is not None and not math.isfinite(value)
        ]
        if bad:
            found.append((Breaker.NON_FINITE, " and ".join(bad)))
        else:
            for breaker, value, detector in (
                (Breaker.GRAD_EXPLOSION, s.grad_norm, self._grad),
                (Breaker.LOSS_DIVERGENCE, s.loss, self._div),
            ):
                why = detector.update(value) if value is not None else None
                if why:
                    found.append((breaker, why))
        if s.io_wait_share is not None:
            why = self._io.update(s.at, s.io_wait_share)
            if why:
                found.append((Breaker.IO_STALL, why))
        for breaker, why in found:
            if breaker not in self._fired:
                self._fired.add(breaker)
                return Detection(breaker, s.at, s.step, f"{why} at step {s.step}")
        return None


def gpu_s_saved_by_stop(job: Job, now: float) -> float:
    """The GPU-seconds a breaker that stops `job` at `now` saves: the GPU time it would still
    have held, from what the live service knows of it, so that the simulator reports what the
    service counts. With a walltime estimate, up to the end the estimate gives (none once it
    has overrun it). Without one its length is unknown, and the rule is that it would have run
    as long again as its current run has lasted: the least a stop saves a job that would
    otherwise have run on, never a guess from its true length, which only the simulator has.
    Call before its GPUs are released."""
    if job.allocation is None:
        return 0.0
    if math.isfinite(job.expected_end_at):
        left = job.expected_end_at - now
    else:
        left = now - (job.started_at if job.started_at is not None else now)
    return max(0.0, left) * job.gpu_share


def _show(value: float) -> str:
    """NaN and infinities as people write them in a report ("loss is NaN")."""
    return "NaN" if math.isnan(value) else str(value)


def first_detection(samples: Iterable[Telemetry], config: BreakerConfig) -> Detection | None:
    """Run fresh breakers over `samples` and return the first detection, if any."""
    breakers = JobBreakers(config)
    for s in samples:
        found = breakers.observe(s)
        if found:
            return found
    return None


class CircuitBreakers:
    """Breakers for every job, under each team's policy (or `default`).

    After a trip that stops a job, further samples of that job are ignored until `forget` (the
    job is gone). A flagged job keeps being watched by its other breakers.
    """

    def __init__(
        self,
        policy_by_team: Mapping[str, BreakerPolicy] | None = None,
        default: BreakerPolicy | None = None,
    ) -> None:
        self._policies = dict(policy_by_team or {})
        self._default = default or BreakerPolicy()
        self._jobs: dict[str, JobBreakers] = {}
        self._stopped: set[str] = set()

    def policy(self, team: str) -> BreakerPolicy:
        return self._policies.get(team, self._default)

    def set_policy(self, team: str, policy: BreakerPolicy) -> None:
        """A team's new policy; jobs already watched keep their breakers' state."""
        self._policies[team] = policy

    def observe(self, team: str, sample: Telemetry) -> Trip | None:
        job_id = sample.job_id
        if job_id in self._stopped:
            return None
        policy = self.policy(team)
        breakers = self._jobs.get(job_id)
        if breakers is None:
            breakers = self._jobs[job_id] = JobBreakers(policy.config)
        found = breakers.observe(sample)
        if found is None:
            return None
        if policy.action is Action.STOP:
            self._stopped.add(job_id)
            del self._jobs[job_id]
        return Trip(job_id=job_id, team=team, action=policy.action, detection=found)

    def forget(self, job_id: str) -> None:
        """Drop a job's state: it finished, or it restarts and its history no longer applies."""
        self._jobs.pop(job_id, None)
        self._stopped.discard(job_id)
