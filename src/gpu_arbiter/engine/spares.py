"""Hot spares (F2): whole nodes held out of normal placement so that jobs displaced by a node
failure restart at once instead of queueing behind everyone else.

A free spare is held in the capacity index as if all its GPUs were busy (drawing no power), so
no placement, backfill or elastic growth ever sees it. After a failure the scheduler *lends*
the free spares to the index, places the displaced jobs (tier 1 first), and takes back the
spares none of them used. A spare a job landed on stays in service; the repaired node refills
the pool of its GPU type, so the pool keeps its size without moving the job back.
"""

from __future__ import annotations

from gpu_arbiter.domain import InvalidInput
from gpu_arbiter.engine.capacity import CapacityIndex


class HotSpares:
    __slots__ = ("index", "free", "target", "_count")

    def __init__(self, index: CapacityIndex) -> None:
        self.index = index
        self.free: dict[int, None] = {}  # free spare nodes, in reservation order
        self.target: dict[str, int] = {}  # spares wanted per GPU type
        self._count: dict[str, int] = {}  # free spares per GPU type

    def __contains__(self, node: int) -> bool:
        return node in self.free

    def reserve(self, node: int) -> None:
        """Make a wholly free, healthy node a spare and count it in its type's target."""
        if not self._hold(node):
            raise InvalidInput(
                f"spares: node {self.index.cluster.nodes[node].name!r} is down or busy"
            )
        t = self.index.node_type[node]
        self.target[t] = self.target.get(t, 0) + 1

    def has(self, gpu_type: str) -> bool:
        return self._count.get(gpu_type, 0) > 0

    def lend(self) -> None:
        """Offer every free spare to placement until `reclaim`."""
        for node in self.free:
            self.index.give(node, self._full(node), 0.0)

    def reclaim(self) -> list[int]:
        """End a `lend`: spares a job now uses leave the pool (returned), the rest are held."""
        used = []
        for node in list(self.free):
            full = self._full(node)
            if self.index.free_mask[node] == full:
                self.index.take(node, full, 0.0)
            else:
                used.append(node)
                self._drop(node)
        return used

    def lost(self, node: int) -> None:
        """A free spare failed: it is no longer ready (a repair may refill the pool)."""
        if node in self.free:
            self._drop(node)

    def refill(self, node: int) -> bool:
        """A repaired, empty node becomes a spare when its type is short of spares."""
        t = self.index.node_type[node]
        if self._count.get(t, 0) >= self.target.get(t, 0):
            return False
        return self._hold(node)

    def _hold(self, node: int) -> bool:
        full = self._full(node)
        if node in self.free or self.index.down[node] or self.index.free_mask[node] != full:
            return False
        self.index.take(node, full, 0.0)
        self.free[node] = None
        t = self.index.node_type[node]
        self._count[t] = self._count.get(t, 0) + 1
        return True

    def _drop(self, node: int) -> None:
        del self.free[node]
        self._count[self.index.node_type[node]] -= 1

    def _full(self, node: int) -> int:
        return (1 << self.index.size[node]) - 1
