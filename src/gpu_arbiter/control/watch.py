"""What the control loop watches in the telemetry of live jobs: circuit breakers and stragglers.

Every report of a running job goes through the same breakers the simulator runs
(`reliability.CircuitBreakers`, under each team's policy) and, when it carries a rank's step
time, through the job's straggler watch (`reliability.GangWatch`). This module only keeps
that state per job and turns an API report into the samples they take; what a trip or a
straggler does to the job, the node and the team is `apply.py`'s.

The state lives in memory. After a restart or a rebuild the loop replays the stored reports of
each running job's current run (`replay`), so a window that was filling up (an I/O stall, a
rising loss) goes on filling instead of starting over; what the replay finds was acted on
before and is not reported again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpu_arbiter.control.schemas import Telemetry, as_float
from gpu_arbiter.reliability import Action, BreakerConfig, BreakerPolicy, CircuitBreakers, Trip
from gpu_arbiter.reliability import Telemetry as Sample
from gpu_arbiter.reliability.stragglers import GangWatch, Straggler, StragglerConfig


class JobWatch:
    def __init__(
        self, stragglers: StragglerConfig | None = None, breakers: BreakerConfig | None = None
    ) -> None:
        self.breaker_config = breakers or BreakerConfig()
        self.breakers = CircuitBreakers(default=BreakerPolicy(config=self.breaker_config))
        self.straggler_config = stragglers or StragglerConfig()
        self.webhooks: dict[str, str] = {}
        self._gangs: dict[str, GangWatch] = {}
        self._steps: dict[str, int] = {}

    def set_team(self, team: str, policy: str | None, webhook_url: str | None) -> None:
        """A team's breaker policy (`stop` when unset) and webhook."""
        action = Action(policy or Action.STOP)
        self.breakers.set_policy(team, BreakerPolicy(action, self.breaker_config))
        if webhook_url:
            self.webhooks[team] = webhook_url
        else:
            self.webhooks.pop(team, None)

    def observe(
        self, job_id: str, team: str, at: float, report: Telemetry
    ) -> tuple[Trip | None, Straggler | None]:
        """One report of a running job: the breaker trip and the straggler it reveals."""
        return self._observe(job_id, team, at, report.data())

    def replay(self, job_id: str, team: str, reports: Iterable[tuple[float, Mapping]]) -> None:
        """Feed a running job's stored reports (time, data) of its current run, in order."""
        for at, data in reports:
            self._observe(job_id, team, at, data)

    def forget(self, job_id: str) -> None:
        """The job ended or starts a new run: what was seen of the last one no longer applies
        (the simulator likewise watches each run afresh)."""
        self.breakers.forget(job_id)
        self._gangs.pop(job_id, None)
        self._steps.pop(job_id, None)

    def _observe(
        self, job_id: str, team: str, at: float, data: Mapping[str, Any]
    ) -> tuple[Trip | None, Straggler | None]:
        step = data.get("step")
        if step is None:
            step = self._steps.get(job_id, 0)
        else:
            self._steps[job_id] = step
        trip = None
        if any(data.get(k) is not None for k in ("loss", "grad_norm", "io_wait_share")):
            sample = Sample(
                job_id=job_id,
                at=at,
                step=step,
                loss=as_float(data.get("loss")),
                grad_norm=as_float(data.get("grad_norm")),
                io_wait_share=data.get("io_wait_share"),
                tokens_per_s=data.get("tokens_per_s"),
                flops=data.get("flops"),
            )
            trip = self.breakers.observe(team, sample)
        straggler = None
        node, step_time = data.get("node"), data.get("step_time_s")
        if node is not None and step_time is not None:
            gang = self._gangs.get(job_id)
            if gang is None:
                gang = self._gangs[job_id] = GangWatch(job_id, self.straggler_config)
            straggler = gang.observe(at, data.get("rank", 0), node, step_time)
        return trip, straggler
