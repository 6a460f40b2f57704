"""Searches that failed, remembered across cycles while what they looked at is unchanged.

Most pending jobs of a busy cluster fail the same placement or preemption search cycle after
cycle. A search's outcome depends only on the state of its GPU type (and of the types sharing
its racks' power caps), so the scheduler stamps each GPU type with an epoch that every start,
stop, resize, hold, fault and repair on it bumps; a failure recorded under a stamp stands until
the stamp changes. A failure at `n` GPUs also stands for any larger request with the same
signature (shape, tier, team, quota standing).
"""

from __future__ import annotations

from collections.abc import Hashable


class FailureMemo:
    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[Hashable, tuple[int, Hashable]] = {}

    def failed(self, sig: Hashable, n: int, stamp: Hashable) -> bool:
        entry = self._entries.get(sig)
        return entry is not None and entry[1] == stamp and entry[0] <= n

    def record(self, sig: Hashable, n: int, stamp: Hashable) -> None:
        entry = self._entries.get(sig)
        if entry is not None and entry[1] == stamp:
            n = min(n, entry[0])
        self._entries[sig] = (n, stamp)
