"""Slurm-like multifactor priority with EASY backfill.

Priority is the partition tier first, then the team's fair-share factor, then age — walked the
same way as Arbiter's order — with best-fit placement (like select/cons_tres) and backfill that
respects the first blocked job's reservation. No preemption, no borrowing or reclaim, no
elastic resizing, no choice of a slower GPU type.
"""

from gpu_arbiter.engine.policy import Heterogeneity, Policy


class BackfillPolicy(Policy):
    name = "backfill"
    quotas = False
    preemption = False
    elastic = False
    heterogeneity = Heterogeneity.ANY
