"""Small builders for engine tests: clusters from the YAML dict format and one-call cycles."""

from __future__ import annotations

from gpu_arbiter.domain import Decision, Preempt, Resize, Start
from gpu_arbiter.domain.presets import cluster_from_dict
from gpu_arbiter.engine import Scheduler
from tests.engine.invariants import check_all


def cluster(*racks: dict, gpu_types: list[dict] | None = None):
    """A cluster from rack dicts in the YAML format (defaults: 8 H100 per node, 40 kW)."""
    full = [{"gpu_type": "H100", "gpus_per_node": 8, **r} for r in racks]
    return cluster_from_dict({"name": "test", "racks": full, "gpu_types": gpu_types or []})


def cycle(sched: Scheduler, now: float) -> list[Decision]:
    """One cycle, with the state invariants checked after it."""
    decisions = sched.cycle(now).decisions
    check_all(sched, decisions)
    return decisions


def starts(decisions: list[Decision]) -> dict[str, Start]:
    return {d.job_id: d for d in decisions if isinstance(d, Start)}


def preempts(decisions: list[Decision]) -> dict[str, Preempt]:
    return {d.job_id: d for d in decisions if isinstance(d, Preempt)}


def resizes(decisions: list[Decision]) -> dict[str, Resize]:
    return {d.job_id: d for d in decisions if isinstance(d, Resize)}


def node_of(sched: Scheduler, job_id: str) -> list[str]:
    alloc = sched.jobs[job_id].allocation
    return [sched.cluster.nodes[n].name for n in alloc.nodes]


def racks_of(sched: Scheduler, job_id: str) -> set[str]:
    alloc = sched.jobs[job_id].allocation
    return {sched.cluster.nodes[n].rack for n in alloc.nodes}
