"""Admission: which tier a job really gets (ROI gate, budget, failure demotion) and whether it
runs within its team's guaranteed quota or on borrowed capacity (S2, E1, E3, E4)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gpu_arbiter.domain import MILLI, JobSpec, Team, Tier
from gpu_arbiter.engine.config import EngineConfig

# Given a team and the tier a job asks for, the tier the team's budget allows (E1).
BudgetRule = Callable[[str, Tier], Tier]


def admitted_tier(spec: JobSpec, cfg: EngineConfig, budget: BudgetRule | None = None) -> Tier:
    """The tier a job runs at. A job above the ROI gate without a justification runs at tier 3
    (E4); a team whose budget is spent gets what the budget rule allows."""
    tier = Tier(spec.tier)
    hours = (spec.walltime_s or spec.duration_s) / 3600.0
    if spec.gpus > cfg.roi_gate_gpus and hours > cfg.roi_gate_hours and not spec.justification:
        tier = Tier.EXPLORATORY
    return budget_capped(spec.team, tier, budget)


def budget_capped(team: str, tier: Tier, budget: BudgetRule | None) -> Tier:
    """`tier`, or the lower tier the team's budget allows now. The scheduler asks at submit and
    again when a stopped job is queued to run anew (its next run segment is billed to a budget
    that may have run out meanwhile); a tier is never raised, so a budget refilled in a later
    period does not restore a job already capped."""
    if budget is None:
        return tier
    return max(tier, Tier(budget(team, tier)))


class QuotaBook:
    """GPUs in use per team, GPU type and tier, against each team's guaranteed quota (S2).

    A team's quota is used first by its most important work: a job is *within quota* when the
    team's jobs of the same or a higher tier, with it, fit in the guarantee. The scheduler marks
    the rest of a team's jobs *borrowed* — reclaimable by the owners of that capacity. Tier-1
    jobs can never be preempted, so beyond their quota they may borrow only from the elastic
    pool (capacity nobody is guaranteed), never from another team's guarantee.

    Everything is counted in thousandths of a GPU (`MILLI` a GPU, as `JobSpec.gpu_milli`): a
    pod holding a quarter of a GPU (S11) uses 250 of its team's quota, not a whole GPU. Counted
    whole, fractional pods would put teams beyond their guarantee with GPUs to spare, so their
    work would run borrowed and their tier-1 pods could not reclaim what was theirs.
    """

    __slots__ = ("quota", "used", "pool", "tier1_excess", "releases")

    def __init__(self, teams: Mapping[str, Team], capacity: Mapping[str, int]) -> None:
        self.quota = {name: {k: v * MILLI for k, v in t.quota.items()} for name, t in teams.items()}
        self.used: dict[tuple[str, str, int], int] = {}
        self.pool = {
            gpu_type: n * MILLI - sum(q.get(gpu_type, 0) for q in self.quota.values())
            for gpu_type, n in capacity.items()
        }
        # What tier-1 jobs hold beyond their team's quota, per (team, GPU type): pool in use.
        self.tier1_excess: dict[tuple[str, str], int] = {}
        # How often a team's use of a type went down (a job stopped or shrank): what can put
        # a team's job back within its quota.
        self.releases: dict[tuple[str, str], int] = {}

    def limit(self, team: str, gpu_type: str) -> int:
        """The team's guarantee on the type, in thousandths of a GPU."""
        return self.quota.get(team, {}).get(gpu_type, 0)

    def used_by(self, team: str, gpu_type: str, max_tier: int = 3) -> int:
        """What the team's jobs of tier `max_tier` or higher use on the type (spelled out for
        the three tiers: every try of a pending job asks)."""
        get = self.used.get
        n = get((team, gpu_type, 1), 0)
        if max_tier >= 2:
            n += get((team, gpu_type, 2), 0)
            if max_tier >= 3:
                n += get((team, gpu_type, 3), 0)
        return n

    def within(self, team: str, gpu_type: str, milli: int, tier: int = 3) -> bool:
        """Whether a job of the tier needing `milli` thousandths of a GPU runs within quota."""
        limit = self.limit(team, gpu_type)
        return milli <= limit and self.used_by(team, gpu_type, tier) + milli <= limit

    def tier1_most(self, team: str, gpu_type: str) -> int:
        """The most the team's tier-1 jobs can ever hold on the type: its guarantee and the
        whole pool, in thousandths of a GPU."""
        return self.limit(team, gpu_type) + self.pool.get(gpu_type, 0)

    def tier1_fits(self, team: str, gpu_type: str, milli: int) -> bool:
        """Whether a tier-1 job needing `milli` thousandths of a GPU fits in the team's quota
        plus what is left of the pool."""
        key = (team, gpu_type)
        excess = max(0, self.used_by(team, gpu_type, 1) + milli - self.limit(team, gpu_type))
        in_pool = sum(v for (_, t), v in self.tier1_excess.items() if t == gpu_type)
        return in_pool - self.tier1_excess.get(key, 0) + excess <= self.pool.get(gpu_type, 0)

    def add(self, team: str, gpu_type: str, tier: int, milli: int) -> None:
        key = (team, gpu_type, int(tier))
        self.used[key] = self.used.get(key, 0) + milli
        if milli < 0:
            self.releases[team, gpu_type] = self.releases.get((team, gpu_type), 0) + 1
