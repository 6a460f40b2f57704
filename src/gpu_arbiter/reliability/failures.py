"""F3: a seeded failure model that injects node faults at realistic rates.

Faults come from two sources, because that is how fleets fail:

* GPU-attributable faults (fatal XID / uncorrectable ECC, NVLink failures) scale with the number
  of GPUs: a node of `g` GPUs sees them at `g * gpu_afr` per year (`gpu_afr` = 4 % by default,
  the figure SPEC F3 uses; a 1000-GPU cluster then sees a GPU fault every ~9 days).
* Host-level faults (kernel panic, PSU, NIC, agent crash: seen as heartbeat loss; cooling trouble:
  thermal throttling) do not scale with GPU count: every GPU node sees them at `node_afr` per year
  (5 % by default, so a 1000-GPU cluster of 8-GPU nodes sees ~46 faults a year in all, one every
  ~8 days).

Each source's rate is split over fault kinds by `share`; each kind has a uniform repair-time
range. Faults are generated per 30-day window: the number of each kind by one Poisson draw, then
times uniform in the window and nodes drawn by weight. That costs a few numpy calls per window,
whatever the cluster size, and makes a schedule for a longer horizon extend a shorter one (the
same seed gives the same faults in the first 30 days whatever the horizon).

Degraded nodes (`DEGRADED_KINDS`, a NIC or link that still works but slowly) come from a model
of their own, with its own `stream` of random numbers, so turning them on leaves the faults
above exactly as they were.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from gpu_arbiter.domain import Cluster, InvalidInput, NodeDown, NodeUp

YEAR_S = 365.0 * 24 * 3600
WINDOW_S = 30.0 * 24 * 3600  # generation window: fixed, so schedules are prefix-stable


class FaultKind(StrEnum):
    GPU_FATAL = "gpu_fatal"  # fatal XID (79 fell off the bus, 48 DBE, ...) or uncorrectable ECC
    NVLINK_DOWN = "nvlink_down"  # NVLink / NVSwitch failure: node reboot, fabric manager restart
    HOST_CRASH = "host_crash"  # kernel panic, PSU, NIC, agent death: heartbeats stop
    THERMAL_THROTTLE = "thermal_throttle"  # cooling trouble: GPUs clock down, node keeps running
    NIC_DEGRADED = "nic_degraded"  # a slow NIC or link: the node runs, its gangs crawl


class FaultScope(StrEnum):
    """Which rate a kind takes its share of: per GPU (`gpu_afr`) or per node (`node_afr`)."""

    GPU = "gpu"
    NODE = "node"


@dataclass(frozen=True, slots=True)
class FaultKindSpec:
    """One fault kind: its `share` of its scope's rate and its repair time, uniform in
    [`repair_min_s`, `repair_max_s`]. A non-`fatal` kind leaves the node running (and its jobs
    with it); its repair time is how long the condition lasts."""

    kind: FaultKind
    scope: FaultScope
    share: float
    repair_min_s: float
    repair_max_s: float
    fatal: bool = True

    def __post_init__(self) -> None:
        where = f"fault kind {self.kind.value}"
        if not (self.share > 0 and math.isfinite(self.share)):
            raise InvalidInput(f"{where}: share must be > 0, got {self.share}")
        if not 0 <= self.repair_min_s <= self.repair_max_s < math.inf:
            raise InvalidInput(
                f"{where}: need 0 <= repair_min_s ({self.repair_min_s}) "
                f"<= repair_max_s ({self.repair_max_s})"
            )


DEFAULT_KINDS: tuple[FaultKindSpec, ...] = (
    # Drain, swap the GPU or baseboard, burn in: hours.
    FaultKindSpec(FaultKind.GPU_FATAL, FaultScope.GPU, 0.7, 2 * 3600.0, 8 * 3600.0),
    # Reboot plus NVSwitch fabric recovery and a health check.
    FaultKindSpec(FaultKind.NVLINK_DOWN, FaultScope.GPU, 0.3, 30 * 60.0, 60 * 60.0),
    # Plain reboot.
    FaultKindSpec(FaultKind.HOST_CRASH, FaultScope.NODE, 0.8, 15 * 60.0, 30 * 60.0),
    # Not fatal: the node slows down until cooling recovers; nothing is cordoned or restarted.
    FaultKindSpec(
        FaultKind.THERMAL_THROTTLE, FaultScope.NODE, 0.2, 10 * 60.0, 60 * 60.0, fatal=False
    ),
)


# A degraded NIC or link is not fatal: the node keeps running and nobody notices until its
# ranks are seen to hold gangs back. It lasts until someone looks: hours to two days.
DEGRADED_KINDS: tuple[FaultKindSpec, ...] = (
    FaultKindSpec(
        FaultKind.NIC_DEGRADED, FaultScope.NODE, 1.0, 4 * 3600.0, 48 * 3600.0, fatal=False
    ),
)


@dataclass(frozen=True, slots=True)
class NodeFault:
    """A fault of `kind` on `node` at `at` (seconds), repaired `repair_s` later."""

    node: str
    at: float
    kind: FaultKind
    repair_s: float
    fatal: bool

    @property
    def repaired_at(self) -> float:
        return self.at + self.repair_s

    def node_down(self) -> NodeDown:
        """The event a driver emits for a fatal fault (jobs on the node are lost)."""
        return NodeDown(node=self.node, at=self.at, reason=f"fault: {self.kind.value}")

    def node_up(self) -> NodeUp:
        """The event a driver emits once the node is repaired."""
        return NodeUp(node=self.node, at=self.repaired_at)


class FailureModel:
    """Deterministic fault injection for a seed. See the module docstring for the rates."""

    def __init__(
        self,
        seed: int,
        gpu_afr: float = 0.04,
        node_afr: float = 0.05,
        kinds: Sequence[FaultKindSpec] = DEFAULT_KINDS,
        stream: int = 0,
    ) -> None:
        """`stream` picks an independent sequence of random numbers for the same seed (a
        second model beside the first, e.g. degraded nodes beside failures)."""
        if seed < 0:
            raise InvalidInput(f"failure model: seed must be >= 0, got {seed}")
        for name, afr in (("gpu_afr", gpu_afr), ("node_afr", node_afr)):
            if not (afr >= 0 and math.isfinite(afr)):
                raise InvalidInput(f"failure model: {name} must be >= 0, got {afr}")
        if len({k.kind for k in kinds}) != len(kinds):
            raise InvalidInput("failure model: a fault kind is listed twice")
        for scope, afr in ((FaultScope.GPU, gpu_afr), (FaultScope.NODE, node_afr)):
            total = sum(k.share for k in kinds if k.scope is scope)
            if afr > 0 and not math.isclose(total, 1.0, rel_tol=1e-9):
                raise InvalidInput(
                    f"failure model: shares of {scope.value}-scope kinds must sum to 1, got {total}"
                )
        self.seed = seed
        self.gpu_afr = gpu_afr
        self.node_afr = node_afr
        self.kinds = tuple(kinds)
        self.stream = stream

    def annual_rates(self, cluster: Cluster) -> dict[FaultKind, float]:
        """Expected faults per year on `cluster`, by kind."""
        gpus = cluster.total_gpus
        nodes = sum(1 for n in cluster.nodes if n.gpus)
        per_scope = {FaultScope.GPU: gpus * self.gpu_afr, FaultScope.NODE: nodes * self.node_afr}
        return {k.kind: k.share * per_scope[k.scope] for k in self.kinds}

    def expected_faults(
        self, cluster: Cluster, horizon_s: float, fatal_only: bool = False
    ) -> float:
        """Mean number of faults in `horizon_s` seconds (what `schedule` returns on average)."""
        rates = self.annual_rates(cluster)
        return (
            sum(rates[k.kind] for k in self.kinds if k.fatal or not fatal_only) * horizon_s / YEAR_S
        )

    def schedule(self, cluster: Cluster, horizon_s: float) -> list[NodeFault]:
        """All faults in [0, `horizon_s`), sorted by time."""
        if not horizon_s >= 0:
            raise InvalidInput(f"failure model: horizon_s must be >= 0, got {horizon_s}")
        out: list[NodeFault] = []
        for fault in self.iter_faults(cluster):
            if fault.at >= horizon_s:
                break
            out.append(fault)
        return out

    def iter_faults(self, cluster: Cluster, start_s: float = 0.0) -> Iterator[NodeFault]:
        """Faults at or after `start_s`, in time order, without end; the same faults as
        `schedule` returns. A simulator can pull the next fault only when it needs it."""
        names = [n.name for n in cluster.nodes]
        gpus = np.array([n.gpus for n in cluster.nodes], dtype=np.float64)
        weights = {FaultScope.GPU: gpus, FaultScope.NODE: (gpus > 0).astype(np.float64)}
        cum = {scope: np.cumsum(w) for scope, w in weights.items()}
        rates = self.annual_rates(cluster)
        per_window = [rates[k.kind] * WINDOW_S / YEAR_S for k in self.kinds]
        if sum(per_window) == 0:
            return
        window = max(0, int(start_s // WINDOW_S))
        while True:
            for fault in self._window(window, names, cum, per_window):
                if fault.at >= start_s:
                    yield fault
            window += 1

    def _window(
        self,
        window: int,
        names: list[str],
        cum: dict[FaultScope, np.ndarray],
        per_window: list[float],
    ) -> list[NodeFault]:
        """The faults of one window, drawn from a generator seeded by (seed, window)."""
        key = [self.seed, window] if not self.stream else [self.seed, window, self.stream]
        rng = np.random.default_rng(key)
        t0 = window * WINDOW_S
        times, nodes, repairs, kind_ids = [], [], [], []
        for i, (spec, lam) in enumerate(zip(self.kinds, per_window, strict=True)):
            n = int(rng.poisson(lam)) if lam > 0 else 0
            if n == 0:
                continue
            c = cum[spec.scope]
            times.append(t0 + rng.random(n) * WINDOW_S)
            nodes.append(np.searchsorted(c, rng.random(n) * c[-1], side="right"))
            span = spec.repair_max_s - spec.repair_min_s
            repairs.append(spec.repair_min_s + rng.random(n) * span)
            kind_ids.append(np.full(n, i))
        if not times:
            return []
        t, nd, rp, kd = (np.concatenate(a) for a in (times, nodes, repairs, kind_ids))
        order = np.lexsort((kd, nd, t))
        return [
            NodeFault(
                node=names[int(nd[j])],
                at=float(t[j]),
                kind=self.kinds[int(kd[j])].kind,
                repair_s=float(rp[j]),
                fatal=self.kinds[int(kd[j])].fatal,
            )
            for j in order
        ]
