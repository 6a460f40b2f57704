"""E3 chargeback: what a job pays for the GPU-seconds it held, posted to the ledger.

A driver (simulator or control plane) calls `ChargeModel.charge_segment` once for every *run
segment*: a stretch of time a job held a fixed allocation, ended by completion, preemption,
resize or failure. The charge is

    credits = price(gpu_type, tier, preemptible) × GPU-hours × (1 - discount)

with GPU-hours = gpus × gpu_milli/1000 × (end - start) / 3600 (a MIG slice pays its share) and
`discount = checkpoint_discount` (default 20 %) when the job checkpoints at least every
`min_checkpoint_interval_s` (default 1 h), else 0.

Failures (F2). A segment that ended in a failure passes `lost_from`: the time of the job's last
checkpoint in the segment (or its start when it saved none). Work in [lost_from, end) is lost,
and who pays for it depends on whether the job opted out of checkpointing:

* checkpointing disabled (`checkpoint_interval_s is None`, and for a live job no checkpoint
  reported through the SDK, `keeps_checkpoints`): the lost GPU-seconds are charged to
  the job with reason "rerun". The job also pays again when it redoes the work: it pays for its
  own re-runs (E3).
* checkpointing enabled (at any interval): the lost GPU-seconds are charged with reason
  "lost-work" and at once refunded in full, reason "failure-absorbed": the cluster absorbs the
  loss. Charging then refunding, rather than not charging, keeps those GPU-seconds in the
  ledger, so an audit still accounts for every second the job held (E6).

Work lost to a preemption is not a failure: it is charged as a normal run (the job accepted a
preemptible tier or borrowed capacity, and the price reflects that). A driver that splits a run
at an elastic resize passes each piece as its own segment; `lost_from` before a segment's start
is clamped to it, because the earlier piece is already posted and entries are immutable.

Live cost (E5). The control plane charges a running segment as time passes (`accrue`: one "run"
charge that grows, [start, t1), then [start, t2), ...; a new one only where the price or the
budget period changes), so spend and budgets see running jobs while a job running for weeks
leaves a handful of ledger entries, not one per minute. It then closes the segment with
`close_segment`, which posts only the rest. What the pieces charged that the close
would not have (seconds after a run's real end, learnt late; lost work of a job that checkpoints)
is refunded from the piece that charged it, naming those seconds.

So for every job: net charges = Σ price × GPU-seconds / 3600 × (1 - discount) over the GPU-seconds
it held, less those lost to failures while it checkpoints. The other half of E3, demoting a job
that disabled checkpointing one tier after such a failure, is the engine's rule
(`Scheduler.node_down`, `EngineConfig.demote_after_uncheckpointed_failure`): it lives there
only, and a driver bills each segment at the tier the job ran it at.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpu_arbiter.domain import MILLI, InvalidInput, Job, JobSpec, Tier
from gpu_arbiter.economy.ledger import Entry, Ledger
from gpu_arbiter.economy.prices import PriceTable

RUN = "run"
RERUN = "rerun"
LOST_WORK = "lost-work"
FAILURE_ABSORBED = "failure-absorbed"
ENDED_EARLIER = "ended-earlier"


def is_preemptible(tier: Tier | int, borrowed: bool) -> bool:
    """The price class of a placement: tier 3 is always preemptible (S1), and capacity borrowed
    beyond a team's quota can be reclaimed at once (S2)."""
    return Tier(tier) == Tier.EXPLORATORY or borrowed


@dataclass(frozen=True, slots=True)
class ChargeModel:
    prices: PriceTable = field(default_factory=PriceTable)
    checkpoint_discount: float = 0.2
    min_checkpoint_interval_s: float = 3600.0

    def __post_init__(self) -> None:
        if not 0 <= self.checkpoint_discount < 1:
            raise InvalidInput(
                "charge model: checkpoint_discount must be in [0, 1), "
                f"got {self.checkpoint_discount}"
            )
        if not (
            self.min_checkpoint_interval_s > 0 and math.isfinite(self.min_checkpoint_interval_s)
        ):
            raise InvalidInput(
                "charge model: min_checkpoint_interval_s must be > 0, "
                f"got {self.min_checkpoint_interval_s}"
            )

    def discount(self, spec: JobSpec) -> float:
        """The fraction taken off this job's price (E3)."""
        interval = spec.checkpoint_interval_s
        if interval is not None and interval <= self.min_checkpoint_interval_s:
            return self.checkpoint_discount
        return 0.0

    def rate(
        self, spec: JobSpec, gpu_type: str, tier: Tier | int, gpus: int, preemptible: bool
    ) -> float:
        """Credits per hour the job costs while it holds `gpus` GPUs (E5 live cost)."""
        price = self.prices.price(gpu_type, tier, preemptible)
        return price * _gpu_count(spec, gpus) * (1 - self.discount(spec))

    def burn_rates(self, running: Iterable[Job]) -> dict[str, float]:
        """Credits per hour per team of the jobs that hold an allocation now (E5)."""
        rates: dict[str, float] = {}
        for job in running:
            if job.allocation is None:
                continue
            rate = self.rate(
                job.spec,
                job.allocation.gpu_type,
                job.tier,
                job.allocation.gpus,
                is_preemptible(job.tier, job.borrowed),
            )
            rates[job.team] = rates.get(job.team, 0.0) + rate
        return rates

    def charge_segment(
        self,
        ledger: Ledger,
        spec: JobSpec,
        *,
        gpu_type: str,
        tier: Tier | int,
        gpus: int,
        start: float,
        end: float,
        preemptible: bool,
        lost_from: float | None = None,
        useful_gpu_seconds: float | None = None,
        keeps_checkpoints: bool | None = None,
    ) -> list[Entry]:
        """Post the entries for one run segment and return them (none for an empty segment).

        `tier` is the tier the job ran at (after any budget cap or demotion), `gpus` the GPUs
        it held. `lost_from` is set only when the segment ended in a failure (see the module
        docstring). `useful_gpu_seconds` (goodput, F4) is recorded on the "run" charge.
        `keeps_checkpoints` says whether the job keeps checkpoints when the driver knows better
        than the spec (a live job saving through the SDK without a declared interval); by
        default it is whether the spec asks for periodic ones.
        """
        if not (math.isfinite(start) and math.isfinite(end)) or end < start:
            raise InvalidInput(f"charge {spec.id}: need start <= end, got [{start}, {end})")
        if gpus < 1:
            raise InvalidInput(f"charge {spec.id}: gpus must be >= 1, got {gpus}")
        cut = end if lost_from is None else min(max(lost_from, start), end)
        count = _gpu_count(spec, gpus)
        price = self.prices.price(gpu_type, tier, preemptible)
        discount = self.discount(spec)

        def post(a: float, b: float, reason: str, useful: float | None) -> Entry:
            credits = price * count * (b - a) / 3600.0 * (1 - discount)
            return ledger.charge(
                spec.id,
                spec.team,
                credits,
                gpu_type,
                tier,
                a,
                b,
                count,
                reason,
                at=end,
                preemptible=preemptible,
                price=price,
                discount=discount,
                useful_gpu_seconds=useful,
            )

        # Lost seconds produced nothing kept; say so only when the driver tracks goodput at all.
        lost_useful = None if useful_gpu_seconds is None else 0.0
        entries: list[Entry] = []
        if cut > start:
            entries.append(post(start, cut, RUN, useful_gpu_seconds))
        elif useful_gpu_seconds:
            raise InvalidInput(f"charge {spec.id}: useful_gpu_seconds given but all work was lost")
        if keeps_checkpoints is None:
            keeps_checkpoints = spec.checkpoint_interval_s is not None
        if end > cut:
            if not keeps_checkpoints:
                entries.append(post(cut, end, RERUN, lost_useful))
            else:
                lost = post(cut, end, LOST_WORK, lost_useful)
                entries += [lost, ledger.refund(lost, lost.credits, FAILURE_ABSORBED, at=end)]
        return entries

    def accrue(
        self,
        ledger: Ledger,
        spec: JobSpec,
        last: Entry | None,
        *,
        gpu_type: str,
        tier: Tier | int,
        gpus: int,
        start: float,
        end: float,
        preemptible: bool,
        same_period: bool,
    ) -> Entry:
        """Charge the seconds [start, end) of a running segment (start < end): by growing
        `last`, the segment's latest "run" charge, when it ends at `start` on the same terms
        (price, discount, GPUs, tier) and `same_period` (budgets count a charge in the period
        of its date, so a charge never grows into the next one), else by a new charge. Either
        way the credits are those `charge_segment` would post for the whole interval."""
        price = self.prices.price(gpu_type, tier, preemptible)
        discount = self.discount(spec)
        count = _gpu_count(spec, gpus)
        if (
            last is not None
            and same_period
            and last.end == start
            and last.start is not None
            and (last.job_id, last.reason, last.gpu_type, last.tier, last.gpus)
            == (spec.id, RUN, gpu_type, Tier(tier), count)
            and (last.price, last.discount, last.preemptible) == (price, discount, preemptible)
        ):
            credits = price * count * (end - last.start) / 3600.0 * (1 - discount)
            return ledger.extend(last, end, credits, at=end)
        (entry,) = self.charge_segment(
            ledger,
            spec,
            gpu_type=gpu_type,
            tier=tier,
            gpus=gpus,
            start=start,
            end=end,
            preemptible=preemptible,
        )
        return entry

    def close_segment(
        self,
        ledger: Ledger,
        spec: JobSpec,
        accrued: Sequence[Entry],
        *,
        gpu_type: str,
        tier: Tier | int,
        gpus: int,
        start: float,
        end: float,
        preemptible: bool,
        lost_from: float | None = None,
        keeps_checkpoints: bool | None = None,
    ) -> list[Entry]:
        """Post what is left of a run segment whose first seconds were charged while it ran:
        `accrued` are those "run" charges, in order, covering [start, the last one's end).

        The seconds after them are charged as `charge_segment` would (lost work included).
        Accrued seconds after `end` (the run ended before the driver last charged it) are
        refunded as "ended-earlier"; accrued seconds after `lost_from` of a job that
        checkpoints are refunded as "failure-absorbed", as if they had been charged as lost
        work. A job that disabled checkpointing already paid for its lost accrued seconds,
        which is what it pays for re-runs anyway. `keeps_checkpoints` as in `charge_segment`."""
        billed_to = accrued[-1].end if accrued else start
        assert billed_to is not None
        entries: list[Entry] = []
        if end > billed_to:
            entries += self.charge_segment(
                ledger,
                spec,
                gpu_type=gpu_type,
                tier=tier,
                gpus=gpus,
                start=billed_to,
                end=end,
                preemptible=preemptible,
                lost_from=lost_from,
                keeps_checkpoints=keeps_checkpoints,
            )
        if keeps_checkpoints is None:
            keeps_checkpoints = spec.checkpoint_interval_s is not None
        absorbed = lost_from is not None and keeps_checkpoints
        for charge in accrued:
            a, b = charge.start, charge.end
            assert a is not None and b is not None
            if absorbed:
                assert lost_from is not None
                entries += _give_back(ledger, charge, max(a, lost_from), min(b, end), end)
            entries += _give_back(ledger, charge, max(a, end), b, end, ENDED_EARLIER)
        return entries


def _give_back(
    ledger: Ledger,
    charge: Entry,
    a: float,
    b: float,
    at: float,
    reason: str = FAILURE_ABSORBED,
) -> list[Entry]:
    """Refund the seconds [a, b) of `charge` (none when the interval is empty)."""
    assert charge.start is not None and charge.end is not None
    if b <= a or charge.end <= charge.start:
        return []
    credits = min(charge.credits * (b - a) / (charge.end - charge.start), ledger.refundable(charge))
    if credits <= 0:
        return []
    return [ledger.refund(charge, credits, reason, at=at, start=a, end=b)]


def _gpu_count(spec: JobSpec, gpus: int) -> float:
    """GPUs as billed: a fractional job (S11) pays its `gpu_milli` share of one GPU."""
    return gpus * spec.gpu_milli / MILLI
