"""A policy is a named composition of the engine's steps.

Each policy is one class in `engine/policies/`, overriding only what differs: how pending jobs
are grouped and walked (ordering), which placement strategy it uses, whether it borrows and
reclaims quota, preempts, backfills with reservations, resizes elastic jobs, or chooses between
GPU types. The scheduler runs the same cycle for all of them.

Policies (and the step modules `engine.migration` and `engine.typechoice` they call) see the
scheduler through `SchedulerView`: the members they may read or call, never its private state.
In a cycle every hook gets the cycle's `engine.context.CycleView`, whose estimates
(`shadow_time`, `preemption_wait`) read and fill that cycle's caches.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from gpu_arbiter.domain import Allocation, Cluster, Job, Tier
from gpu_arbiter.domain.errors import InvalidInput

if TYPE_CHECKING:
    from sortedcontainers import SortedList

    from gpu_arbiter.engine.backfill import Reservation
    from gpu_arbiter.engine.capacity import CapacityIndex
    from gpu_arbiter.engine.config import EngineConfig
    from gpu_arbiter.engine.fairshare import FairShare
    from gpu_arbiter.engine.ordering import PendingQueue


class Placement(StrEnum):
    PACK = "pack"  # best fit
    SPREAD = "spread"


class Backfill(StrEnum):
    RESERVE = "reserve"  # EASY: a blocked job reserves, later jobs backfill around it
    GREEDY = "greedy"  # anything that fits starts
    NONE = "none"  # strict order: the walk stops at the first blocked job


class Heterogeneity(StrEnum):
    SMART = "smart"  # S7: may choose a slower type when the fast one is wanted by pinned jobs
    ANY = "any"  # the accepted types in the policy's order, first that fits


class SchedulerView(Protocol):
    """What a policy may read of the scheduler and ask of it: the queue, the running indexes,
    capacity and books (to read), estimates and dry runs (`types_by_speed`, `est_runtime`,
    `shadow_time`, `preemption_wait`), and the moves a round-based or migrating policy makes
    (`preempt`, `move`, `notice_stop`, `rule_out_move`), and a change with time in whom a
    policy lets preempt whom (`reranked`)."""

    cluster: Cluster
    cfg: EngineConfig
    index: CapacityIndex
    queue: PendingQueue
    fair: FairShare
    jobs: Mapping[str, Job]
    running: dict[str, Job]
    running_by_type: dict[str, dict[str, Job]]
    running_by_tier: dict[tuple[str, int], dict[str, Job]]
    ends_by_type: dict[str, SortedList]
    slower_than: dict[str, dict[str, Job]]
    pending_stops: Mapping[str, object]
    hold_of: Mapping[str, str]

    def types_by_speed(self, job: Job) -> list[str]: ...
    def faster_types(self, job: Job) -> list[str]: ...
    def speed(self, job: Job, gpu_type: str) -> float | None: ...
    def est_runtime(self, job: Job, gpu_type: str, n: int) -> float: ...
    def admissible(self, job: Job, gpu_type: str, n: int) -> bool: ...
    def shadow_time(self, gpu_type: str, n: int, now: float) -> float: ...
    def preemption_wait(self, job: Job, gpu_type: str, n: int, now: float) -> float | None: ...
    def notice_s(self, grace: float) -> float: ...
    def notice_of_tier(self, tier: int) -> float: ...
    def find_for(
        self, job: Job, gpu_type: str, n: int, res: Reservation | None = None, strict: bool = False
    ) -> Allocation | None: ...
    def preempt(self, job: Job, now: float, reason: str, for_job: str | None = None) -> None: ...
    def move(self, job: Job, alloc: Allocation, now: float, reason: str) -> None: ...
    def notice_stop(
        self, job: Job, grace_s: float, reason: str, for_job: str | None = None
    ) -> None: ...
    def rule_out_move(self, job: Job, gpu_type: str) -> None: ...
    def type_epoch(self, gpu_type: str) -> int: ...
    def reranked(self, gpu_type: str) -> None: ...


# The tiers below each tier, lowest (the cheapest victims) first.
_LOWER_TIERS = {1: (3, 2), 2: (3,), 3: ()}


class Policy:
    name = "base"
    placement = Placement.PACK
    quotas = True  # S2: track guarantees, let tier 1 borrow only from the pool, reclaim
    preemption = True
    backfill = Backfill.RESERVE
    elastic = True  # S8
    heterogeneity = Heterogeneity.SMART
    tiers = True  # grace per tier; baselines that ignore tiers stop everything at once
    # Whether the policy suspends jobs by having them save: round-based schedulers (Tiresias,
    # Gavel) checkpoint a job when its lease ends, by design, so it keeps all its progress; the
    # save takes its time (`EngineConfig.notice_stop_s`, as for Arbiter's victims given notice),
    # and the job holds its GPUs until it has saved. Arbiter stops a tier-3 job with little
    # unsaved work at once for a tier-1 job, and it keeps only what its last periodic
    # checkpoint saved (one with more saves first, `engine.preemption.grace`).
    suspend_saves = False
    # Whether a preemption that would throw away uncheckpointed work is weighed against the
    # preemptor's expected wait (see `engine.preemption.plan`); baselines preempt
    # whenever their rule allows.
    weigh_lost_work = False
    # Whether a blocked job for which enough GPUs are free by count (but that cannot be placed
    # on them) still holds them back from backfill (`engine.reservations`): EASY does.
    reserve_fragmented = True
    # Whether a blocked gang that must fit in one node reserves the node expected to have room
    # first rather than a count of the type's GPUs (`engine.reservations`).
    reserve_nodes = False
    # Whether a cycle after arrivals alone may look at the newcomers only (see Scheduler).
    # Off for strict FIFO (a newcomer must not pass a blocked head) and for policies whose
    # order changes with time (attained service, rounds).
    incremental = True

    def group_key(self, job: Job) -> Hashable:
        return (int(job.tier), job.team)

    def rank_key(self, job: Job) -> tuple:
        return (job.spec.submit_s,)

    def ordered(self, sched: SchedulerView, now: float) -> Iterator[Job]:
        return sched.queue.fair_by_tier(sched.fair.share)

    def may_preempt(self, sched: SchedulerView, job: Job, victim: Job, within_quota: bool) -> bool:
        if victim.tier == 1 or victim.team == job.team and victim.tier <= job.tier:
            return False
        if victim.borrowed and within_quota and victim.team != job.team:
            return True
        if (
            job.borrows_at_tier2
            and victim.borrowed
            and victim.team != job.team
            and victim.tier == 2
            and not victim.borrows_at_tier2
        ):
            return True  # tier 1 borrowing at tier 2 goes before tier-2, not tier-1, borrowers
        # A tier-1 job preempts at tier 1 only within its guarantee and the pool (admission):
        # that bound is its quota here, so it takes lower tiers of any team (see engine.preemption).
        return job.tier < victim.tier and (
            within_quota or victim.borrowed or victim.team == job.team or job.tier == Tier.CORE
        )

    def victim_tiers(self, job: Job, within_quota: bool) -> tuple[int, ...]:
        """Tiers of running jobs worth testing with `may_preempt`, lowest tier (cheapest) first:
        lower tiers than the job's, and, for a job within its quota, borrowed jobs of any tier
        but 1 (reclaim); a tier-1 job trying at tier 2 may also take from tier-2 borrowers."""
        return (3, 2) if within_quota or job.borrows_at_tier2 else _LOWER_TIERS[job.tier]

    def victim_min_run(
        self, sched: SchedulerView, job: Job, gpu_type: str, within_quota: bool
    ) -> float:
        """How long (by its walltime estimate) a job of a `victim_tiers` tier starting on the
        type must be expected to run for `may_preempt` ever to let the job stop it: a job with
        no victims there now wakes only for such starts (`engine.memo`). 0: any."""
        return 0.0

    def preempt_key(self, sched: SchedulerView, job: Job, gpu_type: str) -> Hashable:
        """What decides whom `may_preempt` lets the job stop on the type, beyond the fields of a
        search's signature (shape, tier, quota standing, team: `engine.preemption.eligibility`)
        and the victims' own state: jobs that agree on both find the same victims, so a failed
        search stands for them all. None where those fields say it all."""
        return None

    def passes_reservation(self, sched: SchedulerView, job: Job, holder: Job) -> bool:
        """Whether `job` may take GPUs that the backfill reservation of `holder`, a job of its
        tier walked before it, holds (`Scheduler._reservation_over`): by the policy's own
        order within a tier. No: EASY binds every job walked after the holder."""
        return False

    def preempt_reason(self, job: Job, victim: Job) -> str | None:
        """Why `job` stops (or shrinks) `victim`, where a rule of the policy's own allowed it
        (`may_preempt`); None where the tier rules did (the scheduler says so)."""
        return None

    def may_have_victims(
        self, sched: SchedulerView, job: Job, gpu_type: str, within_quota: bool
    ) -> bool:
        """Cheap test before building the victim list: is anything of a tier `victim_tiers`
        names running on the type? (A tier-3 job over its quota has none: it only waits.)"""
        running = sched.running_by_tier
        for k in self.victim_tiers(job, within_quota):
            if running[(gpu_type, k)]:
                return True
        return False

    def victims_too_few(
        self, sched: SchedulerView, job: Job, gpu_type: str, within_quota: bool
    ) -> bool:
        """Whether `may_have_victims` said no only because the job's victims on the type hold
        fewer GPUs than it misses there: GPUs freed by anyone may make them enough, so a job
        set aside waits for every release on the type (`engine.memo`). Not here: any
        victim will do."""
        return False

    def candidate_types(self, sched: SchedulerView, job: Job) -> list[str]:
        return sched.types_by_speed(job)

    def types_when_hopeless(self, sched: SchedulerView, job: Job) -> list[str] | None:
        """`candidate_types` for a job that can start nowhere (`engine.memo`), the
        common failed try of a long queue: with no accepted type free enough there is nothing
        to choose between, so a policy whose type choice is costly may answer without it.
        None where only `candidate_types` can say."""
        return self.candidate_types(sched, job)

    def note_time(self, sched: SchedulerView, now: float) -> None:
        """First thing in a cycle: a policy whose order changes with time tells the scheduler
        of running jobs that became victims since the last cycle (`reranked`)."""

    def before_cycle(self, sched: SchedulerView, now: float) -> None:
        """Round-based policies re-plan here (and may preempt through `sched.preempt`)."""

    def after_walk(self, sched: SchedulerView, now: float, reservations: dict) -> None:
        """After a full walk of the pending jobs: a policy may move running jobs onto GPUs the
        walk left free (see `engine.migration`), honouring the walk's backfill `reservations`
        (GPU type -> `Reservation`)."""

    def next_wakeup(self, sched: SchedulerView, now: float) -> float | None:
        return None


def get_policy(name: str) -> Policy:
    from gpu_arbiter.engine.policies import POLICIES

    try:
        return POLICIES[name]()
    except KeyError:
        raise InvalidInput(f"unknown policy {name!r}: use one of {', '.join(POLICIES)}") from None
