"""Weighted dominant-resource fair share over recent usage (S4).

A team's share is, over GPU types, the largest fraction of the type's capacity it holds now and
has held recently (an exponential average with a configurable half-life), divided by its business
weight. Among jobs of one tier the team with the lowest share goes next, and its share grows as
it is given GPUs within the cycle (progressive filling), so no team starves. A fractional job
(S11) counts its share of a GPU: what a team holds is kept in thousandths of a GPU
(`Job.milli_held`), as in the quota book.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gpu_arbiter.domain import MILLI

LN2 = math.log(2)
_NONE: Mapping[str, float] = {}  # a team that holds nothing (read only)


class FairShare:
    __slots__ = ("capacity", "weights", "alloc", "recent", "half_life", "updated", "_shares")

    def __init__(
        self, capacity: Mapping[str, int], weights: Mapping[str, float], half_life_s: float
    ):
        self.capacity = dict(capacity)
        self.weights = dict(weights)
        self.alloc: dict[str, dict[str, int]] = {}  # thousandths of a GPU held now
        self.recent: dict[str, dict[str, float]] = {}
        self.half_life = half_life_s
        self.updated = 0.0
        # Shares read since the last change: a walk reads a team's share once per job.
        self._shares: dict[str, float] = {}

    def add(self, team: str, gpu_type: str, milli: int) -> None:
        per = self.alloc.setdefault(team, {})
        per[gpu_type] = per.get(gpu_type, 0) + milli
        self._shares.pop(team, None)

    def decay_to(self, now: float) -> None:
        dt = now - self.updated
        if dt <= 0:
            return
        keep = math.exp(-dt * LN2 / self.half_life)
        fresh = 1 - keep
        recent = self.recent
        for team, per in self.alloc.items():
            rec = recent.get(team)
            if rec is None:
                rec = recent[team] = {}
            for t, g in per.items():
                rec[t] = rec.get(t, 0.0) * keep + g / MILLI * fresh
        self.updated = now
        self._shares.clear()

    def share(self, team: str) -> float:
        cached = self._shares.get(team)
        if cached is not None:
            return cached
        per = self.alloc.get(team, _NONE)
        rec = self.recent.get(team, _NONE)
        dominant = 0.0
        for t, cap in self.capacity.items():
            used = (0.5 * (per.get(t, 0) / MILLI) + 0.5 * rec.get(t, 0.0)) / cap
            if used > dominant:
                dominant = used
        share = self._shares[team] = dominant / self.weights.get(team, 1.0)
        return share
