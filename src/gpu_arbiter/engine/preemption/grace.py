"""What notice a victim gets, and when it saves first.

Tier-2 victims get the configured grace (S1) and a checkpoint request. Tier-3 victims are asked
to save first, within `EngineConfig.notice_stop_s`, except that a tier-1 job stops them at once
(S1) as long as that throws away at most `EngineConfig.tier1_stop_max_unsaved_s` of work; one
with more unsaved work saves first, unless the tier-1 job could start at once on free GPUs of
another type that is fast enough for it (S7, `_starts_elsewhere`): a tier-1 job does not queue
for a save by choice. An inference surge (S9) gives no notice. A policy that
ignores tiers stops everyone at once, or gives the time a save takes where it suspends by
saving. Fractional jobs sharing one GPU (S11) stop at once together or save together.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpu_arbiter.domain import MILLI, Job, JobKind, Tier
from gpu_arbiter.engine.sharing import shared_gpu

if TYPE_CHECKING:
    from gpu_arbiter.engine.preemption.plan import PreemptionPlan


class Notices:
    """The notice rules, as the scheduler applies them (mixed into `Scheduler`)."""

    def notice_s(self, grace: float) -> float:
        """How long a job given `grace` seconds of notice is expected to keep running: it saves
        its checkpoint and stops (`EngineConfig.notice_stop_s`), and the grace is its deadline."""
        return min(grace, self.cfg.notice_stop_s)

    def _grace(self, victim: Job, job: Job, now: float) -> float:
        """The notice `job` gives `victim` (`_grace_of_tier`), or the time a save takes where
        stopping it at once would throw away too much (`_save_over`)."""
        grace = self._grace_of_tier(victim.tier, job)
        save_over = self._save_over(victim.tier, job, victim.allocation.gpu_type)
        if victim.spec.gpu_milli < MILLI:
            # Sharers stop at once together, or save together (`_shared_gpu_option`).
            if grace > 0 or save_over is None:
                return grace
            lost = shared_unsaved(self._sharers(*shared_gpu(victim.allocation)), now)
            given = shared_notice(lost, grace, self.cfg.shared_stop_max_unsaved_s, save_over[1])
            return grace if given is None else given
        return notice_given(victim, grace, now, save_over)

    def _save_over(self, tier: int, job: Job, gpu_type: str) -> tuple[float, float] | None:
        """(cap, save_s) where `job` stops victims of `tier` on `gpu_type` at once but gives a
        whole job whose stop would throw away more than `cap` of unsaved work `save_s` to save
        first (`notice_given`; sharers of one GPU have their own cap, `_shared_gpu_option`);
        else None.

        That is tier 3 for a tier-1 job. S1 has tier-3 jobs suspended within the cycle a
        tier-1 job needs their GPUs; one that saves (`notice_stop_s`, a minute) is suspended
        and loses nothing, so the tier-1 job waits that minute rather than throw away more than
        `EngineConfig.tier1_stop_max_unsaved_s` (1 h) of another team's work; but not where it
        could start at once on free GPUs of another type fast enough for it
        (`_starts_elsewhere`): there it would wait by choice, so no whole victim saves first
        (no cap). Victims that stop at once still go first (`victim_options`). It matters most
        for jobs that take no periodic checkpoints, whose whole run would be thrown away. Not
        for an inference surge (S9: it cannot wait) nor for policies that do not weigh lost
        work."""
        if (
            tier == Tier.EXPLORATORY
            and job.tier == Tier.CORE
            and job.spec.kind != JobKind.INFERENCE
            and self.policy.tiers
            and self.policy.weigh_lost_work
        ):
            fast_enough = self.cfg.slower_type_min_speed
            cap = self.cfg.tier1_stop_max_unsaved_s
            if self._starts_elsewhere(job, gpu_type, fast_enough):
                cap = math.inf
            return (cap, self.cfg.notice_stop_s)
        return None

    def _grace_of_tier(self, tier: int, job: Job) -> float:
        """The notice a victim of `tier` gets from `job`: tier 2 the grace (S1); tier 3 stops at
        once for a tier-1 job (S1: within the cycle; `_grace` says which save first) and
        otherwise is asked to save first, with the minute that takes as its deadline
        (`notice_stop_s`; the unsaved work it would lose is worth more than the preemptor's
        minute); an inference surge cannot wait (S9). A policy that ignores tiers stops
        everyone at once, or, if it suspends by saving (`Policy.suspend_saves`), gives them the
        time a save takes."""
        if job.spec.kind == JobKind.INFERENCE:
            return 0.0
        if not self.policy.tiers:
            return self._suspension_s()
        if tier == Tier.EXPLORATORY and job.tier == Tier.CORE:
            return 0.0
        return self.notice_of_tier(tier)

    def _suspension_s(self) -> float:
        """The notice a policy that ignores tiers gives whomever it stops: the time a save takes
        where it suspends by saving (`Policy.suspend_saves`), else none."""
        return self.cfg.notice_stop_s if self.policy.suspend_saves else 0.0

    def notice_of_tier(self, tier: int) -> float:
        """The deadline of a stop notice to a job of `tier`: the tier-2 grace (S1), or for
        tier 3 the time a save takes (`notice_stop_s`); also what a move gives a job
        (`engine.migration`)."""
        return self.cfg.notice_stop_s if tier == Tier.EXPLORATORY else self.cfg.tier2_grace_s

    def _plan_grace(self, job: Job, plan: PreemptionPlan, now: float) -> float:
        """How long the job waits for the plan's victims at most: the longest grace among
        them."""
        return max(
            (self._grace(v.job, job, now) for v in plan.victims if v.shrink_to is None),
            default=0.0,
        )

    def _plan_wait(self, job: Job, plan: PreemptionPlan, now: float) -> float:
        """How long the job is expected to wait for the plan's victims (`notice_wait`)."""
        return max(
            (
                notice_wait(v.job, self.notice_s(self._grace(v.job, job, now)), now)
                for v in plan.victims
                if v.shrink_to is None
            ),
            default=0.0,
        )


def shared_unsaved(sharers: Iterable[Job], now: float) -> float:
    """The work the fractional jobs sharing one GPU would lose together if stopped at `now`."""
    return sum(v.unsaved_at(now) for v in sharers)


def shared_notice(
    lost: float, notice: float, max_unsaved: float, save_s: float | None
) -> float | None:
    """The notice the jobs sharing one GPU get where each would be given `notice`: a stop at
    once that would lose more than `max_unsaved` of their work together (`lost`) becomes
    `save_s` to save first, or, without `save_s`, no stop (None)."""
    if notice == 0 and lost > max_unsaved:
        return save_s
    return notice


def notice_given(
    victim: Job, notice: float, now: float, save_over: tuple[float, float] | None
) -> float:
    """The notice a victim that would be given `notice` gets: where that is 0 (a stop at
    once) and `save_over` = (cap, save_s), `save_s` to save first if the stop would throw away
    more than `cap` of unsaved work (reference seconds x GPUs)."""
    if notice == 0 and save_over is not None:
        if victim.unsaved_at(now) * victim.gpus_held > save_over[0]:
            return save_over[1]
    return notice


def notice_wait(victim: Job, notice: float, now: float) -> float:
    """How long a victim given notice at `now` is expected to keep its GPUs: `notice` seconds
    (the time it takes to save and stop, at most its grace) or, if its walltime estimate says
    so, until it completes before."""
    return min(notice, max(0.0, victim.expected_end_at - now))
