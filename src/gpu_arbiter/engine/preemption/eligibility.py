"""Who may be a victim (S1, S2, S9); the policy's own rule is `Policy.may_preempt`.

- tier-1 jobs are never preempted or shrunk;
- *reclaim*: a job that runs within its team's quota may preempt jobs of other teams that run on
  borrowed capacity, whatever their tier;
- *priority*: a job may preempt a job of a lower tier when it is within its quota, or the
  victim is borrowed, or both belong to the same team: a team beyond its quota cannot take
  another team's guaranteed GPUs just by having a higher tier. A tier-1 job preempts at tier 1
  only within its team's guarantee plus what is left of the pool (`Walk.admissible`), so
  the GPUs it needs exist by count; where they lie scattered over nodes it may stop lower-tier
  jobs of any team. A tier-1 job that borrows at tier 2 is a borrower and takes no guaranteed
  job, but goes before tier-2 jobs borrowing from other teams;
- an inference surge takes GPUs at once from offline work only (S9);
- nobody already stopping, and nobody started in this very cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_arbiter.domain import MILLI, Job, JobKind, Tier
from gpu_arbiter.engine.elastic import shrunk_allocation
from gpu_arbiter.engine.preemption.victims import Option
from gpu_arbiter.engine.sharing import shared_gpu

if TYPE_CHECKING:
    from gpu_arbiter.engine.context import CycleContext, CycleView


class Eligibility:
    """Whether and from whom a pending job may take GPUs (mixed into `Scheduler`)."""

    def _preempt_scope(
        self, job: Job, gpu_type: str, n: int, ctx: CycleContext
    ) -> tuple[bool, bool] | None:
        """None where the job may not preempt for `n` GPUs of the type (no preemption, or a
        tier-1 job that would not fit in the pool); else (whether it runs within its team's
        quota there, whether anybody of a tier it may take from runs there). Asked by the
        hopeless test, the type choice's dry runs and the preemption step alike, so it is
        worked out once per type in a try (nothing changes within a try until it succeeds)."""
        key = (job.id, gpu_type, n)
        scopes = ctx.scopes
        if key in scopes:
            return scopes[key]
        scope = None
        if self.policy.preemption and self.admissible(job, gpu_type, n):
            within = self.quota.within(job.team, gpu_type, n * job.spec.gpu_milli, job.tier)
            scope = (within, self.policy.may_have_victims(ctx.view, job, gpu_type, within))
        scopes[key] = scope
        return scope

    def _preempt_sig(self, job: Job, gpu_type: str, within: bool, view: CycleView) -> tuple:
        """What a preemption search depends on besides the GPU count: jobs that agree on it
        find the same victims (or none)."""
        s = job.spec
        tier = (int(job.tier), job.borrows_at_tier2)
        shape = (gpu_type, s.tp_size, s.max_racks, s.power_profile, s.kind)
        return (shape, tier, within, job.team, self.policy.preempt_key(view, job, gpu_type))

    def _may_take(
        self, job: Job, option: Option, within: bool, inference: bool, view: CycleView
    ) -> bool:
        """Whether the job may stop (or shrink) the option's jobs now: none of them is stopping
        already, an inference job takes only what S9 lets it, the policy allows each, and
        nobody joined a shared GPU since the option was made."""
        for v in option.jobs:
            if v.id in self.pending_stops:
                return False
            if inference and not self._inference_may_take(v):
                return False
            if not self.policy.may_preempt(view, job, v, within):
                return False
        if option.jobs[0].spec.gpu_milli >= MILLI:
            return True
        return self.shared.used.get(shared_gpu(option.part)) == sum(
            v.spec.gpu_milli for v in option.jobs
        )

    def _in_victim_group(self, v: Job, group: int | str, now: float) -> bool:
        """Whether running job `v` is an option of its own in a victim list of `group` (a tier,
        or "shrink"); a fractional job is one only with the others on its GPU
        (`_shared_gpu_option`)."""
        if v.started_at == now or v.spec.gpu_milli < MILLI:
            return False  # never undo a start of this very cycle
        # A running job is in `elastic_running` when it is elastic and the policy resizes.
        shrinks = v.id in self.elastic_running and shrunk_allocation(v) is not None
        if group == "shrink":
            return shrinks
        return int(v.tier) == group and not shrinks

    @staticmethod
    def _inference_may_take(victim: Job) -> bool:
        """S9: an inference job takes GPUs at once from offline work only: tier-3 or borrowed
        training, never another service and never owned tier-2 work (that needs notice)."""
        return victim.spec.kind == JobKind.TRAINING and (
            victim.tier == Tier.EXPLORATORY or victim.borrowed
        )
