"""The pure scheduling engine: one cycle from a cluster state to decisions.

Where each question is answered:

| question | module |
|---|---|
| what does one cycle do, in what order? | `scheduler` (`Scheduler.cycle`, a list of named steps) |
| what runs where; what may change it? | `state` (`EngineState`, the only mutator) |
| what does a cycle know while it runs? | `context` (`CycleContext`, `CycleView`) |
| how is one pending job tried? | `walk` (place -> preempt -> reserve) |
| in what order are pending jobs walked? | `ordering`, `fairshare`, the policy's `ordered` |
| may a job run at its tier, within quota? | `admission`, `borrowing` |
| which GPU types can a job use, how fast? | `fit`; slow or fast type now: `typechoice` |
| where do a job's GPUs go? | `placement`, over `capacity` (free GPUs), `sharing`, `spares` |
| who holds GPUs back for a blocked job? | `reservations`, over `backfill` (EASY) |
| why is a failed try not repeated? | `memo` |
| who may be a victim? | `preemption/eligibility` (and `Policy.may_preempt`) |
| how are victims chosen, in what order? | `preemption/victims` (one ordering key) |
| what notice does a victim get? | `preemption/grace` |
| whether to preempt at all, which plan? | `preemption/plan` |
| why does this job wait? | `waiting` (`Scheduler.why_pending`) |
| when does an elastic job grow or shrink? | `elastic` |
| when does a running job move to a faster type, or make way for a pinned one? | `migration` |
| what a policy may see and decide | `policy` (`Policy`, `SchedulerView`), `policies/` |
"""

from gpu_arbiter.engine.config import EngineConfig
from gpu_arbiter.engine.policy import Policy, get_policy
from gpu_arbiter.engine.scheduler import CycleResult, Scheduler

__all__ = ["CycleResult", "EngineConfig", "Policy", "Scheduler", "get_policy"]
