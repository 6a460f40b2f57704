"""Cluster topology: GPU → NVLink domain → node → rack (leaf switch) → pod (spine).

A `Cluster` is immutable once built; what is free or busy lives in the engine's capacity index.
Nodes get a dense integer `index` so hot paths can use lists instead of dictionaries.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from gpu_arbiter.domain.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class GpuType:
    """A GPU model. `speed` is throughput relative to an H100 for a typical training job."""

    name: str
    speed: float = 1.0
    power_w: float = 700.0
    memory_gib: int = 80

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidInput("gpu type: name must not be empty")
        if self.speed <= 0:
            raise InvalidInput(f"gpu type {self.name}: speed must be > 0, got {self.speed}")
        if self.power_w <= 0:
            raise InvalidInput(f"gpu type {self.name}: power_w must be > 0, got {self.power_w}")


# Typical figures: relative training throughput (H100 = 1.0) and board power.
GPU_CATALOG: dict[str, GpuType] = {
    t.name: t
    for t in (
        GpuType("B200", speed=1.9, power_w=1000, memory_gib=192),
        GpuType("H200", speed=1.15, power_w=700, memory_gib=141),
        GpuType("H100", speed=1.0, power_w=700, memory_gib=80),
        GpuType("A100", speed=0.87, power_w=400, memory_gib=80),
        GpuType("L40S", speed=0.6, power_w=350, memory_gib=48),
        GpuType("V100", speed=0.35, power_w=300, memory_gib=32),
    )
}


@dataclass(frozen=True, slots=True)
class Rack:
    """A rack behind one leaf switch. `power_cap_w` is never exceeded by placement (S10)."""

    name: str
    pod: str = "pod0"
    power_cap_w: float = 40_000.0
    labels: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.power_cap_w <= 0:
            raise InvalidInput(f"rack {self.name}: power_cap_w must be > 0, got {self.power_cap_w}")


@dataclass(frozen=True, slots=True)
class Node:
    """A host with `gpus` GPUs of one type, split into NVLink domains of `nvlink_domain` GPUs."""

    name: str
    gpu_type: str
    gpus: int
    rack: str
    nvlink_domain: int = 0  # 0 means the whole node is one NVLink domain
    idle_power_w: float = 1_000.0
    labels: frozenset[str] = frozenset()
    numa_nodes: int = 2
    nvme_tb: float = 0.0
    index: int = -1

    def __post_init__(self) -> None:
        if self.gpus < 0:
            raise InvalidInput(f"node {self.name}: gpus must be >= 0, got {self.gpus}")
        if self.gpus > 64:
            raise InvalidInput(f"node {self.name}: gpus must be <= 64, got {self.gpus}")
        domain = self.nvlink_domain or self.gpus
        if self.gpus and (domain <= 0 or self.gpus % domain):
            raise InvalidInput(
                f"node {self.name}: nvlink_domain {self.nvlink_domain} must divide gpus {self.gpus}"
            )

    @property
    def domain_size(self) -> int:
        return self.nvlink_domain or self.gpus


@dataclass(frozen=True)
class Cluster:
    """The whole topology. Build with `Cluster.build` so names are checked and indices assigned."""

    name: str
    nodes: tuple[Node, ...]
    racks: Mapping[str, Rack]
    gpu_types: Mapping[str, GpuType]
    _by_name: Mapping[str, int] = field(default_factory=dict, repr=False)

    @classmethod
    def build(
        cls,
        name: str,
        nodes: Iterable[Node],
        racks: Iterable[Rack],
        gpu_types: Iterable[GpuType] = (),
    ) -> Cluster:
        rack_map: dict[str, Rack] = {}
        for rack in racks:
            if rack.name in rack_map:
                raise InvalidInput(f"cluster {name}: rack {rack.name!r} declared twice")
            rack_map[rack.name] = rack
        types = dict(GPU_CATALOG)
        for t in gpu_types:
            types[t.name] = t
        built: list[Node] = []
        by_name: dict[str, int] = {}
        for node in nodes:
            if node.name in by_name:
                raise InvalidInput(f"cluster {name}: node {node.name!r} declared twice")
            if node.rack not in rack_map:
                raise InvalidInput(
                    f"cluster {name}: node {node.name!r} is in unknown rack {node.rack!r}"
                )
            if node.gpus and node.gpu_type not in types:
                raise InvalidInput(
                    f"cluster {name}: node {node.name!r} has unknown gpu_type {node.gpu_type!r}"
                )
            idx = len(built)
            by_name[node.name] = idx
            built.append(replace(node, index=idx))
        if not any(n.gpus for n in built):
            raise InvalidInput(f"cluster {name}: has no GPUs")
        used_types = {n.gpu_type for n in built if n.gpus}
        return cls(
            name=name,
            nodes=tuple(built),
            racks=rack_map,
            gpu_types={k: v for k, v in types.items() if k in used_types},
            _by_name=by_name,
        )

    def node(self, name: str) -> Node:
        try:
            return self.nodes[self._by_name[name]]
        except KeyError:
            raise InvalidInput(f"unknown node {name!r}") from None

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    def gpus_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.nodes:
            if n.gpus:
                out[n.gpu_type] = out.get(n.gpu_type, 0) + n.gpus
        return out

    def max_node_gpus(self, gpu_type: str) -> int:
        return max((n.gpus for n in self.nodes if n.gpu_type == gpu_type), default=0)

    def max_gang(self, gpu_type: str, max_racks: int | None = None) -> int:
        """Largest gang of `gpu_type` that fits on an empty cluster within `max_racks` racks."""
        per_rack: dict[str, int] = {}
        for n in self.nodes:
            if n.gpu_type == gpu_type:
                per_rack[n.rack] = per_rack.get(n.rack, 0) + n.gpus
        sizes = sorted(per_rack.values(), reverse=True)
        return sum(sizes[:max_racks] if max_racks else sizes)
