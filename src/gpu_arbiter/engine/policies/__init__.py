"""Every policy under one interface; a new policy is a new module here."""

from gpu_arbiter.engine.policies.arbiter import ArbiterPolicy
from gpu_arbiter.engine.policies.backfill import BackfillPolicy
from gpu_arbiter.engine.policies.fifo import FifoPolicy
from gpu_arbiter.engine.policies.gavel import GavelPolicy
from gpu_arbiter.engine.policies.tiresias import TiresiasPolicy

POLICIES = {
    p.name: p for p in (FifoPolicy, BackfillPolicy, TiresiasPolicy, GavelPolicy, ArbiterPolicy)
}

__all__ = [
    "POLICIES",
    "ArbiterPolicy",
    "BackfillPolicy",
    "FifoPolicy",
    "GavelPolicy",
    "TiresiasPolicy",
]
