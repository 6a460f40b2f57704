"""The one interface every executor implements.

The control plane turns each engine decision into calls here: `Start` → `start`, `Preempt` →
`stop(grace_s)`, `Resize` → `resize` (stop and start with the new GPUs where the executor
cannot resize in place), and calls `poll` every loop to learn what happened. Executors never
decide anything; they report facts as domain events.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpu_arbiter.domain import Event


@dataclass(frozen=True, slots=True)
class Placement:
    """What an executor needs to run a job: which GPUs on which hosts, and how."""

    job_id: str
    command: str
    gpus_by_node: Mapping[str, tuple[int, ...]]  # node name -> GPU indices on it
    gpu_type: str
    env: Mapping[str, str] = field(default_factory=dict)
    team: str = ""
    tier: int = 3
    run_as: str | None = None  # the team's unix user (None: the executor's own)
    walltime_s: float | None = None  # the user's estimate of the job's run time, if any


@dataclass(frozen=True, slots=True)
class Running:
    """A job an executor reports as running (used to reconcile after a restart)."""

    job_id: str
    nodes: Sequence[str]


class Backend(Protocol):
    name: str

    def start(self, placement: Placement) -> None:
        """Launch the job on exactly the given GPUs; returns once it is submitted."""

    def stop(self, job_id: str, grace_s: float) -> None:
        """Ask the job to stop (SIGTERM or equivalent), and kill it after `grace_s`."""

    def resize(self, placement: Placement) -> None:
        """Move a running elastic job to a new set of GPUs."""

    def poll(self) -> list[Event]:
        """Events since the last poll: jobs finished or stopped, nodes down or up."""

    def running(self) -> list[Running]:
        """Jobs the executor believes are running now (after a control-plane restart)."""
