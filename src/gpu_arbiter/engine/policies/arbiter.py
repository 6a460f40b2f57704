"""Arbiter's policy: every step on.

Tiers first; within a tier, teams by weighted dominant share (S4). Placement packs (S5, S6);
a blocked job preempts by tier or reclaims borrowed capacity (S1, S2), shrinking elastic jobs
before stopping anyone (S8); otherwise it gets an EASY reservation that backfill honours (S6).
Flexible jobs move to a slower GPU type when the fast one is wanted by jobs pinned to it (S7).
"""

from gpu_arbiter.engine.policy import Policy


class ArbiterPolicy(Policy):
    name = "arbiter"
