"""Fractional GPUs (S11): small jobs asking for `gpu_milli` < 1000 share GPUs.

A GPU becomes *shared* when the first fractional job lands on it: it is taken from the capacity
index like any busy GPU, so whole-GPU jobs only ever see wholly free GPUs and their placement
stays exactly as fast as before. Shared GPUs are indexed separately, per GPU type, by the
milli-units they have left; a fractional job goes best-fit onto the shared GPU with the least
room that still fits it, and opens a new shared GPU (best-fit placement of one GPU) only when
none fits. The milli-units on a GPU never sum past 1000; the last job to leave gives the GPU
back to the index. A preemptor frees a shared GPU by stopping every job on it, at once or, where
they save first, after closing the GPU to newcomers until the last one has left
(`engine.preemption`).
"""

from __future__ import annotations

from sortedcontainers import SortedList

from gpu_arbiter.domain import MILLI, Allocation
from gpu_arbiter.engine.capacity import CapacityIndex


def shared_gpu(alloc: Allocation) -> tuple[int, int]:
    """(node, GPU) of a fractional job's allocation: the one GPU it shares."""
    ((node, (gpu,)),) = alloc.slots
    return node, gpu


class SharedGpus:
    __slots__ = ("index", "used", "watts", "room", "closed")

    def __init__(self, index: CapacityIndex) -> None:
        self.index = index
        self.used: dict[tuple[int, int], int] = {}  # (node, gpu) -> milli-units in use
        self.watts: dict[tuple[int, int], float] = {}  # power booked when the GPU was opened
        self.room: dict[str, SortedList] = {}  # per type: (milli left, node, gpu), left > 0
        self.closed: set[tuple[int, int]] = set()  # GPUs being freed: no room for newcomers

    def find(self, gpu_type: str, milli: int) -> Allocation | None:
        """The shared GPU of `gpu_type` with the least room left that fits `milli`."""
        room = self.room.get(gpu_type)
        if not room:
            return None
        i = room.bisect_left((milli, -1, -1))
        if i == len(room):
            return None
        _, node, gpu = room[i]
        return Allocation(gpu_type, ((node, (gpu,)),))

    def take(self, node: int, gpu: int, milli: int, watts: float) -> None:
        """Put `milli` units on GPU `gpu` of `node`, opening it when it is not shared yet."""
        key = (node, gpu)
        used = self.used.get(key)
        if used is None:
            self.index.take(node, 1 << gpu, watts)
            self.watts[key] = watts
            used = 0
        elif used + milli > MILLI:
            raise RuntimeError(f"double booking on node {node} GPU {gpu}: {used} + {milli} milli")
        else:
            self._room(node).remove((MILLI - used, node, gpu))
        self._set(key, used + milli)

    def give(self, node: int, gpu: int, milli: int) -> None:
        """Remove `milli` units from a shared GPU; the last job out returns it to the index."""
        key = (node, gpu)
        used = self.used[key]
        if used < MILLI and key not in self.closed:
            self._room(node).remove((MILLI - used, node, gpu))
        if used == milli:
            del self.used[key]
            self.closed.discard(key)
            self.index.give(node, 1 << gpu, self.watts.pop(key))
        else:
            self._set(key, used - milli)

    def close(self, node: int, gpu: int) -> None:
        """Take no more jobs onto a shared GPU whose jobs are all stopping, so that it frees up
        whole once they have (a preemptor holds it)."""
        key = (node, gpu)
        used = self.used[key]
        if key not in self.closed and used < MILLI:
            self._room(node).remove((MILLI - used, node, gpu))
        self.closed.add(key)

    def _set(self, key: tuple[int, int], used: int) -> None:
        self.used[key] = used
        if used < MILLI and key not in self.closed:
            node, gpu = key
            self._room(node).add((MILLI - used, node, gpu))

    def _room(self, node: int) -> SortedList:
        t = self.index.node_type[node]
        room = self.room.get(t)
        if room is None:
            room = self.room[t] = SortedList()
        return room
