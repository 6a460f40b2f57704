"""The economy in a simulation: budgets at admission, one charge per run segment, the bill.

The simulator owns one `SimEconomy` (unless `SimConfig.economy` is None) and calls it at the
points where it already tracks run segments:

* `tick(now)` at the start of every simulated instant: opens the budget period containing
  `now` (E1) and moves the clock the budget rule reads;
* `budget_rule` is handed to the `Scheduler` as its `BudgetRule`, so the engine stays pure and
  only sees a callable (team, tier) -> tier. The engine asks it when a job is submitted and
  when a stopped job is queued again (after a preemption or a failure);
* `open(job, now)` when a job starts or is resized, `close(job, now)` when that run segment
  ends (finish, preemption, resize, failure or the end of the simulation). Each closed
  segment is charged exactly once (E3, E6).

What a segment was is frozen at `open`: GPU type, GPU count, the tier the job ran at and its
price class (tier 3 or borrowed capacity is preemptible). The engine may change `job.tier`
while stopping it (failure demotion, E3), so reading it at `close` would bill the demoted tier.

A segment ended by a failure is recognised by `job.restarts` having grown since `open` (the
engine's `node_down` counts them). Its lost work starts at the last checkpoint, recovered from
the engine's own goodput books: the GPU-seconds `close_segment` marked lost, divided by the GPUs
held, before the end; a segment that kept nothing lost all of it, from its start. Who pays for
the lost work (the job when it disabled checkpointing, else the cluster) is the charge model's
rule; the tier demotion that follows is the engine's (`EngineConfig.
demote_after_uncheckpointed_failure`), the only place that rule lives.

Spend reaches the ledger when a segment closes, so a team's remaining budget lags its running
jobs by at most their current segments; a long job can overspend by that much.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_arbiter.domain import MILLI, Job, Team, Tier
from gpu_arbiter.economy import (
    RUN,
    BudgetPolicy,
    Budgets,
    ChargeModel,
    Ledger,
    TeamBill,
    is_preemptible,
    team_bills,
)
from gpu_arbiter.economy.ledger import CHARGE


@dataclass(frozen=True, slots=True)
class EconomyConfig:
    """Prices and discounts (`model`) and how budgets are granted (`budget`)."""

    model: ChargeModel = field(default_factory=ChargeModel)
    budget: BudgetPolicy = field(default_factory=BudgetPolicy)


@dataclass(slots=True)
class _Segment:
    start: float
    gpu_type: str
    gpus: int
    tier: Tier
    preemptible: bool
    useful_gpu_s: float  # the job's counters at the start, to take differences at the end
    lost_gpu_s: float
    restarts: int


class SimEconomy:
    def __init__(self, teams: Iterable[Team], config: EconomyConfig | None = None) -> None:
        cfg = config or EconomyConfig()
        self.model = cfg.model
        self.ledger = Ledger()
        self.budgets = Budgets.for_teams(self.ledger, teams, cfg.budget)
        self.now = -math.inf
        self.burn_rates: dict[str, float] = {}
        self._open: dict[str, _Segment] = {}
        self._period: int | None = None  # the budget period last opened

    def tick(self, now: float) -> None:
        """Move the clock; a new budget period is opened (granted) at its first instant. The
        budgets never change during a run, so within a period there is nothing to grant."""
        self.now = now
        period = self.budgets.period_index(now)
        if period != self._period:
            self.budgets.open_period(now)
            self._period = period

    def budget_rule(self, team: str, tier: Tier) -> Tier:
        """The engine's `BudgetRule`: tier 3 (by default) once the team has spent its budget."""
        return self.budgets.effective_tier(team, tier, self.now)

    def open(self, job: Job, now: float) -> None:
        alloc = job.allocation
        assert alloc is not None, f"job {job.id} opened a segment without an allocation"
        self._open[job.id] = _Segment(
            start=now,
            gpu_type=alloc.gpu_type,
            gpus=alloc.gpus,
            tier=job.tier,
            preemptible=is_preemptible(job.tier, job.borrowed),
            useful_gpu_s=job.useful_gpu_s,
            lost_gpu_s=job.lost_gpu_s,
            restarts=job.restarts,
        )

    def close(self, job: Job, now: float) -> None:
        """Charge the job's open segment, if any, as ending at `now`."""
        seg = self._open.pop(job.id, None)
        if seg is None:
            return
        share = job.spec.gpu_milli / MILLI  # a fractional job is billed (and useful) pro rata
        useful = (job.useful_gpu_s - seg.useful_gpu_s) * share
        lost_from = None
        if job.restarts > seg.restarts:
            lost_s = (job.lost_gpu_s - seg.lost_gpu_s) / seg.gpus
            lost_from = max(seg.start, now - lost_s) if useful > 0 else seg.start
        run_end = now if lost_from is None else lost_from
        self.model.charge_segment(
            self.ledger,
            job.spec,
            gpu_type=seg.gpu_type,
            tier=seg.tier,
            gpus=seg.gpus,
            start=seg.start,
            end=now,
            preemptible=seg.preemptible,
            lost_from=lost_from,
            # Float noise must not make useful exceed held GPU-seconds (the ledger refuses it).
            useful_gpu_seconds=min(useful, seg.gpus * share * (run_end - seg.start)),
        )

    def finish(self, running: Iterable[Job]) -> None:
        """Record what the jobs still running cost per hour (call after closing their segments)."""
        self.burn_rates = self.model.burn_rates(running)

    def useful_gpu_seconds(self) -> dict[str, float]:
        """GPU-seconds that produced kept progress, per team, as recorded on the charges."""
        useful: dict[str, list[float]] = {}
        for e in self.ledger.entries():
            if e.kind == CHARGE and e.reason == RUN:
                useful.setdefault(e.team, []).append(e.useful_gpu_seconds or 0.0)
        return {team: math.fsum(v) for team, v in sorted(useful.items())}

    def bills(self) -> list[TeamBill]:
        return team_bills(
            self.ledger,
            prices=self.model.prices,
            burn_rates=self.burn_rates,
            useful_gpu_seconds=self.useful_gpu_seconds(),
            budgets=self.budgets,
            now=self.now,
        )

    def kpis(self) -> dict[str, Any]:
        """`cost_by_team` and the cluster-wide `cost_per_useful_gpu_hour`, JSON-able."""
        bills = self.bills()
        spent = math.fsum(b.credits_spent for b in bills)
        useful = math.fsum(b.useful_gpu_hours or 0.0 for b in bills)
        return {
            "cost_by_team": {
                b.team: {
                    "credits": b.credits_spent,
                    "gpu_hours": b.gpu_hours_total,
                    "useful_gpu_hours": b.useful_gpu_hours or 0.0,
                    "credits_per_useful_gpu_hour": b.credits_per_useful_gpu_hour,
                }
                for b in bills
            },
            "cost_per_useful_gpu_hour": spent / useful if useful else None,
        }

    def write(self, out_dir: Path) -> None:
        """DIR/ledger.jsonl and DIR/usage.json, what `arbiter bill --from-sim DIR` reads."""
        self.ledger.to_jsonl(out_dir / "ledger.jsonl")
        usage = {
            "useful_gpu_seconds": self.useful_gpu_seconds(),
            "burn_rate_credits_per_hour": dict(sorted(self.burn_rates.items())),
        }
        (out_dir / "usage.json").write_text(json.dumps(usage, indent=2) + "\n")
