"""Preemption, one module per question: who may be a victim (`eligibility`), in what order
(`victims`), with what notice (`grace`), and which plan wins (`plan`)."""

from gpu_arbiter.engine.preemption.grace import (
    notice_given,
    notice_wait,
    shared_notice,
    shared_unsaved,
)
from gpu_arbiter.engine.preemption.plan import PreemptionPlan, Victim, plan_preemption
from gpu_arbiter.engine.preemption.victims import (
    Option,
    option_key,
    shared_gpu_option,
    victim_options,
)

__all__ = [
    "Option",
    "PreemptionPlan",
    "Victim",
    "notice_given",
    "notice_wait",
    "option_key",
    "plan_preemption",
    "shared_gpu_option",
    "shared_notice",
    "shared_unsaved",
    "victim_options",
]
