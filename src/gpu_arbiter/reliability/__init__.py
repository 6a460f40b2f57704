"""Reliability and goodput (SPEC F1-F5): failure injection, node health, lost work and hot
spares, circuit breakers, synthetic telemetry, goodput and MTTR accounting.

Pure like the engine: every call takes its time as an argument; nothing reads a clock or does
I/O, so the simulator and the control plane share it. Imports only `gpu_arbiter.domain`.
"""

from gpu_arbiter.reliability.breakers import (
    Action,
    Breaker,
    BreakerConfig,
    BreakerPolicy,
    CircuitBreakers,
    Detection,
    JobBreakers,
    Telemetry,
    Trip,
    first_detection,
    gpu_s_saved_by_stop,
    mfu,
)
from gpu_arbiter.reliability.checkpoint import LostWork, RunSegment, SparePool
from gpu_arbiter.reliability.failures import (
    DEFAULT_KINDS,
    DEGRADED_KINDS,
    FailureModel,
    FaultKind,
    FaultKindSpec,
    FaultScope,
    NodeFault,
)
from gpu_arbiter.reliability.goodput import GoodputLedger, GoodputTotals, MttrTracker
from gpu_arbiter.reliability.health import (
    FATAL_XIDS,
    HealthCause,
    HealthMonitor,
    HealthReport,
    NodeVerdict,
)
from gpu_arbiter.reliability.pathologies import Pathology, detect, telemetry_stream

__all__ = [
    "DEFAULT_KINDS",
    "DEGRADED_KINDS",
    "FATAL_XIDS",
    "Action",
    "Breaker",
    "BreakerConfig",
    "BreakerPolicy",
    "CircuitBreakers",
    "Detection",
    "FailureModel",
    "FaultKind",
    "FaultKindSpec",
    "FaultScope",
    "GoodputLedger",
    "GoodputTotals",
    "HealthCause",
    "HealthMonitor",
    "HealthReport",
    "JobBreakers",
    "LostWork",
    "MttrTracker",
    "NodeFault",
    "NodeVerdict",
    "Pathology",
    "RunSegment",
    "SparePool",
    "Telemetry",
    "Trip",
    "detect",
    "first_detection",
    "mfu",
    "gpu_s_saved_by_stop",
    "telemetry_stream",
]
