"""The context of one cycle: the walk's reservations, caches that hold while the cycle lasts,
and what the steps tell each other about the job being looked at."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpu_arbiter.engine.backfill import Reservation
    from gpu_arbiter.engine.preemption.victims import Option


@dataclass(slots=True)
class CycleContext:
    """What one cycle has worked out so far, passed to every step of its walk."""

    reservations: dict[str, Reservation] = field(default_factory=dict)
    now: float = 0.0
    victims: dict[tuple, list[Option]] = field(default_factory=dict)  # `_victim_groups`
    victim_index: dict[tuple, dict[str, Option]] = field(default_factory=dict)  # by job id
    dry_runs: dict[tuple, tuple[int, float | None]] = field(default_factory=dict)
    scopes: dict[tuple, tuple[bool, bool] | None] = field(default_factory=dict)  # one try's
    shadows: dict[tuple[str, int], tuple[int, float]] = field(default_factory=dict)
    attempts: int = 0
    preempted: int = 0
    high_power: dict[int, int] = field(default_factory=dict)
    blocked_types: set[str] = field(default_factory=set)
    stranded_types: set[str] = field(default_factory=set)
    waiting: dict[str, int] = field(default_factory=dict)  # GPUs blocked jobs want, by type
    stop: bool = False
    timely: bool = False  # the job being looked at met a rule that can change with time alone
    wait_on: str | None = None  # the type the job being looked at waits for, if not its fastest
    kept_for: str | None = None  # whose reservation kept the job being looked at off free GPUs
    retry: bool = False  # a per-cycle limit (power stagger) held a job back: look again next cycle
    # A victim stopped at once went back to the queue behind the walk: it may fit elsewhere now.
    stopped_at_once: bool = False
