"""Stragglers: a node whose ranks hold a whole gang back.

In a synchronous multi-node job the slowest rank sets the pace of every step, so one node with
a bad NIC (or a throttled GPU) slows all of them. Each rank reports its own step time (the time
it needs before it waits for the others); a node is a straggler when the median of its ranks'
latest step times stays above `factor` times the median of the ranks on the *other* nodes for
`window_s` seconds. The other nodes, not the whole gang, so that a slow node cannot raise the
median it is compared with (in a two-node gang it would be half of it).

Each node of a job is reported at most once per run of the job (`GangWatch` is per run).
The control plane feeds it the step times live jobs report; the simulator feeds it a seeded
synthetic stream (`detect`) to learn when a degraded node would be caught.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpu_arbiter.domain import InvalidInput


@dataclass(frozen=True, slots=True)
class StragglerConfig:
    factor: float = 1.5
    window_s: float = 300.0

    def __post_init__(self) -> None:
        if not (self.factor > 1 and math.isfinite(self.factor)):
            raise InvalidInput(f"stragglers: factor must be > 1, got {self.factor}")
        if not (self.window_s >= 0 and math.isfinite(self.window_s)):
            raise InvalidInput(f"stragglers: window_s must be >= 0, got {self.window_s}")


@dataclass(frozen=True, slots=True)
class Straggler:
    """`node` held the gang of `job_id` back from `since` to `at`, its ranks `ratio` times
    slower than the rest."""

    job_id: str
    node: str
    since: float
    at: float
    ratio: float
    factor: float

    @property
    def reason(self) -> str:
        return (
            f"straggler: its ranks took {self.ratio:.1f}x the gang's median step time for "
            f"{self.at - self.since:.0f} s in job {self.job_id} (limit {self.factor:g}x)"
        )


class GangWatch:
    """Step times of one job's ranks (see the module docstring)."""

    __slots__ = ("job_id", "cfg", "_ranks", "_slow_since", "_reported")

    def __init__(self, job_id: str, cfg: StragglerConfig) -> None:
        self.job_id = job_id
        self.cfg = cfg
        self._ranks: dict[tuple[str, int], float] = {}  # (node, rank) -> latest step time
        self._slow_since: dict[str, float] = {}
        self._reported: set[str] = set()

    def observe(self, at: float, rank: int, node: str, step_time_s: float) -> Straggler | None:
        """A rank's step time at `at`; the first straggler this report reveals, if any."""
        self._ranks[(node, rank)] = step_time_s
        by_node: dict[str, list[float]] = {}
        for (n, _), t in self._ranks.items():
            by_node.setdefault(n, []).append(t)
        if len(by_node) < 2:
            return None
        found = None
        for n in sorted(by_node):
            others = [t for m, ts in by_node.items() if m != n for t in ts]
            ratio = statistics.median(by_node[n]) / statistics.median(others)
            if ratio <= self.cfg.factor:
                self._slow_since.pop(n, None)
                continue
            since = self._slow_since.setdefault(n, at)
            if found is None and n not in self._reported and at - since >= self.cfg.window_s:
                self._reported.add(n)
                found = Straggler(self.job_id, n, since, at, ratio, self.cfg.factor)
        return found


def detect(
    ranks_by_node: Sequence[int],
    slow: int,
    slowdown: float,
    interval_s: float,
    config: StragglerConfig,
    horizon_s: float,
    seed: int = 0,
) -> Straggler | None:
    """The first straggler a `GangWatch` finds in a gang with `ranks_by_node[i]` ranks on node
    `i`, each reporting every `interval_s` for up to `horizon_s`: a healthy rank's step takes
    1 s give or take 5 % (lognormal), a rank on node `slow` takes `slowdown` times as long.
    Times are seconds from the first report; nodes are named by their position."""
    if not (interval_s > 0 and math.isfinite(interval_s)):
        raise InvalidInput(f"stragglers: interval_s must be > 0, got {interval_s}")
    rng = np.random.default_rng(seed)
    watch = GangWatch("synthetic", config)
    ranks = [(str(n), r) for n, count in enumerate(ranks_by_node) for r in range(count)]
    pace = np.array([slowdown if n == str(slow) else 1.0 for n, _ in ranks])
    for i in range(int(horizon_s // interval_s) + 1):
        times = pace * rng.lognormal(0.0, 0.05, len(ranks))
        for k, (node, _) in enumerate(ranks):
            found = watch.observe(i * interval_s, k, node, float(times[k]))
            if found is not None:
                return found
    return None
