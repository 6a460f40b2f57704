"""The pending queue, grouped and ranked by the policy, and the orders policies walk it in.

Jobs are kept in per-group sorted lists (a group is e.g. a tier and a team), so a cycle walks
only as far into the queue as it needs instead of sorting every pending job. Changes made while
a cycle walks the queue are buffered and applied when the cycle ends.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterator

from sortedcontainers import SortedList

from gpu_arbiter.domain import Job


class PendingQueue:
    __slots__ = (
        "group_key",
        "rank_key",
        "groups",
        "members",
        "pinned",
        "pinned_as",
        "sizes",
        "version",
        "_walking",
        "_buffer",
    )

    def __init__(
        self,
        group_key: Callable[[Job], Hashable],
        rank_key: Callable[[Job], tuple],
    ) -> None:
        self.group_key = group_key
        self.rank_key = rank_key
        self.groups: dict[Hashable, SortedList] = {}
        self.members: dict[str, tuple[Hashable, tuple]] = {}
        # GPUs wanted by pending jobs that accept one type only, by type and the jobs' tier
        # (index 1-3; `pinned_at_or_above`), and each such job's (type, tier) when it joined.
        self.pinned: dict[str, list[int]] = {}
        self.pinned_as: dict[str, tuple[str, int]] = {}
        self.sizes: dict[int, int] = {}  # pending jobs by the fewest GPUs they can start on
        self.version = 0  # changes with every job added or removed
        self._walking = False
        self._buffer: list[tuple[bool, Job]] = []

    def __len__(self) -> int:
        return len(self.members)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self.members

    def add(self, job: Job) -> None:
        if self._walking:
            self._buffer.append((True, job))
            return
        if job.id in self.members:
            return
        group = self.group_key(job)
        item = (*self.rank_key(job), job.seq, job)
        sl = self.groups.get(group)
        if sl is None:
            sl = self.groups[group] = SortedList(key=lambda x: x[:-1])
        sl.add(item)
        self.members[job.id] = (group, item)
        self.version += 1
        self._count(job, +1)

    def remove(self, job: Job) -> None:
        if self._walking:
            self._buffer.append((False, job))
            return
        entry = self.members.pop(job.id, None)
        if entry is None:
            return
        group, item = entry
        sl = self.groups[group]
        sl.remove(item)
        if not sl:
            del self.groups[group]
        self.version += 1
        self._count(job, -1)

    def smallest(self) -> int:
        """The fewest GPUs any pending job can start on (the queue must not be empty)."""
        return min(self.sizes)

    def pinned_at_or_above(self, gpu_type: str, tier: int) -> int:
        """GPUs of the type wanted by pending jobs that accept it only, of `tier` or a higher
        one (a smaller number)."""
        counts = self.pinned.get(gpu_type)
        return sum(counts[1 : tier + 1]) if counts is not None else 0

    def _count(self, job: Job, sign: int) -> None:
        """Keep `sizes` and `pinned` current as the job joins (+1) or leaves (-1); a job
        counts at the tier it joined at (a tier-1 job trying at tier 2 may start, and leave,
        as tier 2)."""
        n = job.spec.elastic_range[0]
        left = self.sizes.get(n, 0) + sign
        if left:
            self.sizes[n] = left
        else:
            del self.sizes[n]
        if len(job.spec.gpu_types) == 1:
            if sign > 0:
                (t,) = job.spec.gpu_types
                self.pinned_as[job.id] = (t, int(job.tier))
            t, tier = self.pinned_as[job.id] if sign > 0 else self.pinned_as.pop(job.id)
            self.pinned.setdefault(t, [0, 0, 0, 0])[tier] += sign * job.spec.gpus

    def begin_walk(self) -> None:
        self._walking = True

    def end_walk(self) -> None:
        self._walking = False
        buffered, self._buffer = self._buffer, []
        for adding, job in buffered:
            (self.add if adding else self.remove)(job)

    def jobs(self) -> Iterator[Job]:
        for sl in self.groups.values():
            for item in sl:
                yield item[-1]

    # -- walks -----------------------------------------------------------------------------

    def in_group_order(self) -> Iterator[Job]:
        """Groups by ascending key, each group in rank order."""
        for group in sorted(self.groups):
            for item in self.groups[group]:
                yield item[-1]

    def by_rank(self) -> Iterator[Job]:
        """All jobs by rank, merging the groups."""
        streams = [(item for item in sl) for sl in self.groups.values()]
        for item in heapq.merge(*streams, key=lambda x: x[:-1]):
            yield item[-1]

    def fair_by_tier(self, share: Callable[[str], float]) -> Iterator[Job]:
        """Groups keyed (tier, team): tiers in order; within a tier the team with the lowest
        share next, its share read again after each of its jobs is considered."""
        tiers: dict[int, list[tuple[str, SortedList]]] = {}
        for (tier, team), sl in self.groups.items():
            tiers.setdefault(tier, []).append((team, sl))
        for tier in sorted(tiers):
            heap = [(share(team), team, iter(sl)) for team, sl in tiers[tier]]
            heapq.heapify(heap)
            while heap:
                last, team, it = heap[0]
                item = next(it, None)
                if item is None:
                    heapq.heappop(heap)
                    continue
                yield item[-1]
                now = share(team)
                if now != last:  # unchanged (its job did not start): it stays the lowest
                    heapq.heapreplace(heap, (now, team, it))  # teams are unique: no ties
