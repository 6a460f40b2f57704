"""Knobs of the engine, with the defaults the SPEC names."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineConfig:
    tier2_grace_s: float = 7200.0  # S1: notice a tier-2 job gets before it is stopped
    # How long a job given notice takes to save its checkpoint and stop (the SDK saves at its
    # next step on SIGTERM); the grace is only its deadline. As long as restoring takes; set it
    # to the grace where jobs ignore the notice and run until they are killed. Tier-3 victims of
    # tier-2 and tier-3 jobs get this long to save (0: they stop at once and lose unsaved work),
    # and so do the jobs round-based baselines suspend (0: their saves take no time).
    notice_stop_s: float = 60.0
    restart_overhead_s: float = 60.0  # time a restarted job spends restoring its checkpoint
    max_examined: int = 1000  # pending jobs looked at per cycle (like Slurm's bf_max_job_test)
    max_preemption_attempts: int = 32  # victim searches per cycle
    fairshare_half_life_s: float = 3600.0  # S4: how fast past usage is forgotten
    slower_type_min_speed: float = 0.5  # S7: slowest relative speed worth moving a job to
    high_power_starts_per_rack: int = 2  # S10: high-power jobs started per rack per cycle
    roi_gate_gpus: int = 128  # E4: jobs above this many GPUs ...
    roi_gate_hours: float = 24.0  # ... for longer than this need a justification
    demote_after_uncheckpointed_failure: bool = True  # E3
    # S2 for tier 1: a tier-1 job its team's guarantee and the pool cannot hold now may start at
    # tier 2 beyond them, as a tier-2 job could (idle GPUs, tier-3 victims; preemptible with
    # notice, like any borrower), rather than wait; it is tier 1 again once it stops. False: it
    # waits for room in its guarantee or pool.
    tier1_borrows_at_tier2: bool = True
    # Queueing targets of tiers 1, 2 and 3; a tier-1 job expected (by walltime estimates) to
    # get its GPUs within its target waits rather than throw away a victim's uncheckpointed work.
    queue_target_s: tuple[float, float, float] = (300.0, 3600.0, 14400.0)
    # Below tier 1, a preemption that throws away uncheckpointed work is made only when the GPU
    # time lost, times this weight, is at most the GPU time the preemptor would wait
    # (`engine.preemption.plan`). Lost work is capacity gone for everybody, and the
    # victim goes back in line; a wait only delays the preemptor.
    lost_work_weight: float = 2.0
    # Fractional jobs sharing one GPU (S11) are stopped together at once (for a tier-1 job, S1,
    # or an inference surge, S9) only while their unsaved work adds up to at most this much
    # (`engine.preemption.victims`): one GPU freed throws away every sharer's progress, and
    # small pods rarely checkpoint. Beyond it they save first for a tier-1 job, in
    # `notice_stop_s`, as a whole tier-3 job would; an inference surge looks elsewhere.
    shared_stop_max_unsaved_s: float = 3600.0
    # A tier-3 job that a tier-1 job needs stopped (S1) stops at once while that throws away
    # at most this much unsaved work (reference seconds x GPUs); beyond it, it saves first, in
    # `notice_stop_s`, and the tier-1 job waits that minute (`engine.preemption.grace`); the
    # measurements that chose the value are in the git history of docs/results/README.md.
    tier1_stop_max_unsaved_s: float = 3600.0
