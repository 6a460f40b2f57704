"""F1: decide from heartbeats and GPU health reports which nodes to cordon, and say why.

The monitor is pure: drivers feed it heartbeats and reports with their timestamps and ask
`check(now)` for verdicts. A verdict is issued once per cordon: a cordoned node stays quiet
until `uncordon` (after repair), so a flapping or dead node does not flood the scheduler.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from gpu_arbiter.domain import InvalidInput, NodeDown

# XIDs after which the GPU (or the node) must be reset or replaced before it runs work again.
# Application-caused XIDs (13, 31, 43, 45: a bad kernel or a killed process) are left out:
# they kill a job, not the node.
FATAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    63: "ECC page retirement / row remap pending a reset",
    64: "ECC page retirement / row remap failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


class HealthCause(StrEnum):
    MISSED_HEARTBEAT = "missed_heartbeat"
    FATAL_XID = "fatal_xid"
    ECC_UNCORRECTABLE = "ecc_uncorrectable"
    NVLINK_DOWN = "nvlink_down"
    OVERHEATING = "overheating"


@dataclass(frozen=True, slots=True)
class HealthReport:
    """What a node agent reports. `xids`: XID codes seen since the previous report;
    `ecc_uncorrectable`: the volatile uncorrectable ECC count (NVML's: since the driver last
    loaded, so a reboot clears it); `nvlink_down`: links reported down; `temperature_c`: the
    hottest GPU, or None when not measured."""

    xids: tuple[int, ...] = ()
    ecc_uncorrectable: int = 0
    nvlink_down: int = 0
    temperature_c: float | None = None


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    """Cordon and drain `node`, decided at `at`, for `causes`; `reason` is for people."""

    node: str
    at: float
    causes: tuple[HealthCause, ...]
    reason: str

    def node_down(self) -> NodeDown:
        return NodeDown(node=self.node, at=self.at, reason=self.reason)


class HealthMonitor:
    """Heartbeat and GPU-health rules of F1.

    A node is cordoned when it has not been heard from (heartbeat or report) for more than
    `heartbeat_timeout_s`, reports an XID in `fatal_xids`, an uncorrectable ECC count of at least
    `ecc_uncorrectable_limit`, at least `nvlink_down_limit` NVLink links down, or a temperature of
    at least `max_temperature_c` (90 °C: past the slowdown point of current data-centre GPUs,
    H100 slows at 89 °C and shuts down at 92 °C, so drain before the hardware does it for us).
    Nodes never heard from are unknown, not dead: they never fire.
    """

    def __init__(
        self,
        heartbeat_timeout_s: float = 30.0,
        fatal_xids: Iterable[int] = FATAL_XIDS,
        ecc_uncorrectable_limit: int = 1,
        nvlink_down_limit: int = 1,
        max_temperature_c: float = 90.0,
    ) -> None:
        if not (heartbeat_timeout_s > 0 and math.isfinite(heartbeat_timeout_s)):
            raise InvalidInput(
                f"health: heartbeat_timeout_s must be > 0, got {heartbeat_timeout_s}"
            )
        if ecc_uncorrectable_limit < 1:
            raise InvalidInput(
                f"health: ecc_uncorrectable_limit must be >= 1, got {ecc_uncorrectable_limit}"
            )
        if nvlink_down_limit < 1:
            raise InvalidInput(f"health: nvlink_down_limit must be >= 1, got {nvlink_down_limit}")
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.fatal_xids = frozenset(fatal_xids)
        self.ecc_uncorrectable_limit = ecc_uncorrectable_limit
        self.nvlink_down_limit = nvlink_down_limit
        self.max_temperature_c = max_temperature_c
        self._last_seen: dict[str, float] = {}
        self._pending: dict[str, dict[HealthCause, str]] = {}
        self._cordoned: set[str] = set()

    @property
    def cordoned(self) -> frozenset[str]:
        return frozenset(self._cordoned)

    def heartbeat(self, node: str, at: float) -> None:
        """`node` is alive at `at`. It does not uncordon a cordoned node: only repair does."""
        self._last_seen[node] = max(at, self._last_seen.get(node, at))

    def report(self, node: str, at: float, report: HealthReport) -> None:
        """Record a health report; it also counts as a heartbeat (the agent is alive)."""
        self.heartbeat(node, at)
        if node in self._cordoned:
            return
        found = self._pending.setdefault(node, {})
        fatal = sorted(x for x in set(report.xids) if x in self.fatal_xids)
        if fatal:
            found[HealthCause.FATAL_XID] = "fatal " + ", ".join(
                f"XID {x} ({FATAL_XIDS.get(x, 'listed as fatal')})" for x in fatal
            )
        if report.ecc_uncorrectable >= self.ecc_uncorrectable_limit:
            found[HealthCause.ECC_UNCORRECTABLE] = (
                f"{report.ecc_uncorrectable} uncorrectable ECC error(s) "
                f"(limit {self.ecc_uncorrectable_limit})"
            )
        if report.nvlink_down >= self.nvlink_down_limit:
            found[HealthCause.NVLINK_DOWN] = f"{report.nvlink_down} NVLink link(s) down"
        t = report.temperature_c
        if t is not None and t >= self.max_temperature_c:
            found[HealthCause.OVERHEATING] = f"GPU at {t:g} C (limit {self.max_temperature_c:g} C)"
        if not found:
            del self._pending[node]

    def check(self, now: float) -> list[NodeVerdict]:
        """Cordon every node with a fatal finding or a stale heartbeat; sorted by node name.

        Findings stay pending until this call even if a later report looks healthy: an XID or
        an ECC error that happened is a fault even when the next sample is clean.
        """
        verdicts: list[NodeVerdict] = []
        for node, seen in self._last_seen.items():
            if node in self._cordoned:
                continue
            found = self._pending.pop(node, {})
            silent = now - seen
            if silent > self.heartbeat_timeout_s:
                found[HealthCause.MISSED_HEARTBEAT] = (
                    f"missed heartbeats: silent for {silent:g} s "
                    f"(timeout {self.heartbeat_timeout_s:g} s)"
                )
            if found:
                reason = f"node {node}: " + "; ".join(found.values())
                verdicts.append(NodeVerdict(node, now, tuple(found), reason))
        self._cordoned.update(v.node for v in verdicts)
        verdicts.sort(key=lambda v: v.node)
        return verdicts

    def uncordon(self, node: str, at: float) -> None:
        """`node` is repaired at `at`: forget its findings and start a fresh heartbeat window,
        so a node that was down for hours is not cordoned again before it can check in."""
        self._cordoned.discard(node)
        self._pending.pop(node, None)
        self.heartbeat(node, at)
