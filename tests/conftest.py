"""Shared fixtures: small real clusters and jobs, nothing that needs I/O."""

import pytest

from gpu_arbiter.domain import JobSpec, Tier, default_teams
from gpu_arbiter.domain.presets import small


@pytest.fixture
def cluster():
    return small()


@pytest.fixture
def teams(cluster):
    return default_teams(cluster.gpus_by_type(), {"a": 1.0, "b": 1.0})


def job(id: str, team: str = "a", tier: int = 3, gpus: int = 1, duration: float = 100.0, **kw):
    return JobSpec(id=id, team=team, tier=Tier(tier), gpus=gpus, duration_s=duration, **kw)
