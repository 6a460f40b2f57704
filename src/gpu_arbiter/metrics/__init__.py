"""KPIs computed the same way for simulated and live runs (SPEC "Metrics")."""

from gpu_arbiter.metrics.kpis import JobRecord, compute_kpis, percentile
from gpu_arbiter.metrics.timeline import Segment, timeline

__all__ = ["JobRecord", "Segment", "compute_kpis", "percentile", "timeline"]
