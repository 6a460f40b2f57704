"""Teams, their business weight and their guaranteed quotas (S2)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpu_arbiter.domain.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class Team:
    """`quota` is the guaranteed GPUs per GPU type; `weight` is the business value that sets
    fair-share (S4) and, through `default_teams`, the size of the quota."""

    name: str
    weight: float = 1.0
    quota: Mapping[str, int] = field(default_factory=dict)
    budget_per_period: float | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidInput("team: name must not be empty")
        if self.weight <= 0:
            raise InvalidInput(f"team {self.name}: weight must be > 0, got {self.weight}")
        for gpu_type, n in self.quota.items():
            if n < 0:
                raise InvalidInput(f"team {self.name}: quota for {gpu_type} must be >= 0, got {n}")


def default_teams(
    gpus_by_type: Mapping[str, int],
    weights: Mapping[str, float] | Sequence[str],
    guaranteed_share: float = 0.8,
) -> list[Team]:
    """Split `guaranteed_share` of each GPU type among teams in proportion to their weight.

    The remaining share is the elastic pool that nobody owns (S2).
    """
    if not 0 <= guaranteed_share <= 1:
        raise InvalidInput(f"guaranteed_share must be in [0, 1], got {guaranteed_share}")
    if not isinstance(weights, Mapping):
        weights = {name: 1.0 for name in weights}
    if not weights:
        raise InvalidInput("at least one team is needed")
    total_w = sum(weights.values())
    teams = []
    for name, w in weights.items():
        quota = {t: int(n * guaranteed_share * w / total_w) for t, n in gpus_by_type.items()}
        teams.append(Team(name=name, weight=w, quota=quota))
    return teams


def check_quotas(teams: Sequence[Team], gpus_by_type: Mapping[str, int]) -> None:
    """Refuse quotas that promise more GPUs of a type than the cluster has."""
    for gpu_type in {t for team in teams for t in team.quota}:
        promised = sum(team.quota.get(gpu_type, 0) for team in teams)
        have = gpus_by_type.get(gpu_type, 0)
        if promised > have:
            raise InvalidInput(
                f"quotas promise {promised} {gpu_type} GPUs but the cluster has {have}"
            )
