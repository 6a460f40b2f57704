"""The indexed free capacity of the cluster, updated incrementally (DESIGN: rules for speed).

For every GPU type the index keeps, per number of free GPUs k, an insertion-ordered set of the
nodes that have exactly k free GPUs, both cluster-wide and per rack, plus running totals per
type, rack and pod and the power drawn per rack. Placement reads these buckets instead of
scanning nodes; taking or giving GPUs moves one node between two buckets.
"""

from __future__ import annotations

from gpu_arbiter.domain import Cluster

# Fraction of board power a GPU draws under a job of each power profile (S10).
POWER_FACTOR = {"normal": 0.8, "high": 1.0}


class CapacityIndex:
    __slots__ = (
        "cluster",
        "free_mask",
        "free",
        "size",
        "domain",
        "node_type",
        "node_rack",
        "down",
        "buckets",
        "rack_buckets",
        "rack_free",
        "type_free",
        "type_racks",
        "rack_names",
        "rack_pod",
        "rack_cap",
        "rack_power",
        "whole_free",
        "max_size",
        "type_total",
        "_label_racks",
    )

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        nodes = cluster.nodes
        self.rack_names: list[str] = list(cluster.racks)
        rack_idx = {name: i for i, name in enumerate(self.rack_names)}
        self.rack_pod: list[str] = [cluster.racks[r].pod for r in self.rack_names]
        self.rack_cap: list[float] = [cluster.racks[r].power_cap_w for r in self.rack_names]
        self.rack_power: list[float] = [0.0] * len(self.rack_names)
        self.size: list[int] = [n.gpus for n in nodes]
        self.domain: list[int] = [n.domain_size for n in nodes]
        self.free: list[int] = [0] * len(nodes)
        self.free_mask: list[int] = [0] * len(nodes)
        self.node_type: list[str] = [n.gpu_type for n in nodes]
        self.node_rack: list[int] = [rack_idx[n.rack] for n in nodes]
        self.down: list[bool] = [False] * len(nodes)
        self.max_size: dict[str, int] = {}
        for n in nodes:
            if n.gpus:
                self.max_size[n.gpu_type] = max(self.max_size.get(n.gpu_type, 0), n.gpus)
        self.buckets: dict[str, list[dict[int, None]]] = {
            t: [{} for _ in range(m + 1)] for t, m in self.max_size.items()
        }
        self.rack_buckets: dict[tuple[str, int], list[dict[int, None]]] = {}
        self.rack_free: dict[tuple[str, int], int] = {}
        self.type_free: dict[str, int] = {t: 0 for t in self.max_size}
        self.type_total: dict[str, int] = {t: 0 for t in self.max_size}
        self.whole_free: dict[str, int] = {t: 0 for t in self.max_size}
        self.type_racks: dict[str, list[int]] = {t: [] for t in self.max_size}
        self._label_racks: dict[tuple[str, str], tuple[int, ...]] = {}
        for n in nodes:
            self.rack_power[self.node_rack[n.index]] += n.idle_power_w
            if not n.gpus:
                continue
            key = (n.gpu_type, self.node_rack[n.index])
            if key not in self.rack_buckets:
                self.rack_buckets[key] = [{} for _ in range(self.max_size[n.gpu_type] + 1)]
                self.rack_free[key] = 0
                self.type_racks[n.gpu_type].append(key[1])
            self.type_total[n.gpu_type] += n.gpus
            self._set_free(n.index, (1 << n.gpus) - 1)

    # -- queries ---------------------------------------------------------------------------

    @property
    def total_free(self) -> int:
        return sum(self.type_free.values())

    def nodes_with(self, gpu_type: str, k: int) -> dict[int, None]:
        return self.buckets[gpu_type][k]

    def label_racks(self, label: str, gpu_type: str) -> tuple[int, ...]:
        """Racks with GPUs of `gpu_type` that carry the data-locality `label` (S5)."""
        key = (label, gpu_type)
        if key not in self._label_racks:
            self._label_racks[key] = tuple(
                r
                for r in self.type_racks.get(gpu_type, ())
                if label in self.cluster.racks[self.rack_names[r]].labels
            )
        return self._label_racks[key]

    def power_headroom(self, rack: int) -> float:
        return self.rack_cap[rack] - self.rack_power[rack]

    def watts_per_gpu(self, gpu_type: str, profile: str) -> float:
        return self.cluster.gpu_types[gpu_type].power_w * POWER_FACTOR[profile]

    # -- updates ---------------------------------------------------------------------------

    def take(self, node: int, mask: int, watts_per_gpu: float) -> None:
        """Mark the GPUs in `mask` busy; they must be free."""
        if self.free_mask[node] & mask != mask:
            raise RuntimeError(
                f"double booking on node {node}: {mask:b} vs free {self.free_mask[node]:b}"
            )
        self._set_free(node, self.free_mask[node] & ~mask)
        self.rack_power[self.node_rack[node]] += watts_per_gpu * mask.bit_count()

    def give(self, node: int, mask: int, watts_per_gpu: float) -> None:
        """Return the GPUs in `mask`; they must be busy."""
        if self.free_mask[node] & mask:
            raise RuntimeError(f"releasing free GPUs on node {node}: {mask:b}")
        self.rack_power[self.node_rack[node]] -= watts_per_gpu * mask.bit_count()
        if not self.down[node]:
            self._set_free(node, self.free_mask[node] | mask)

    def set_down(self, node: int) -> None:
        """Take a node out of service: none of its GPUs is offered until `set_up`."""
        self.down[node] = True
        self._set_free(node, 0)

    def set_up(self, node: int, busy_mask: int) -> None:
        """Put a node back in service; GPUs in `busy_mask` are still held by jobs."""
        self.down[node] = False
        full = (1 << self.size[node]) - 1
        self._set_free(node, full & ~busy_mask)

    def _set_free(self, node: int, mask: int) -> None:
        t = self.node_type[node]
        old_k = self.free[node]
        k = mask.bit_count()
        self.free_mask[node] = mask
        if k == old_k:
            return
        rack = self.node_rack[node]
        key = (t, rack)
        size = self.size[node]
        if old_k:
            del self.buckets[t][old_k][node]
            del self.rack_buckets[key][old_k][node]
        if k:
            self.buckets[t][k][node] = None
            self.rack_buckets[key][k][node] = None
        self.free[node] = k
        delta = k - old_k
        self.type_free[t] += delta
        self.rack_free[key] += delta
        self.whole_free[t] += (size if k == size else 0) - (size if old_k == size else 0)
