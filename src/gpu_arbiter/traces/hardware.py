"""GPU models the public traces ran on, and the rack packing shared by the trace clusters.

`GPU_CATALOG` knows only current models. The traces come from Pascal- to Ampere-era clusters,
so their GPUs are defined here with the same meaning: `speed` is typical training throughput
relative to an H100 (V100 = 0.35 in the catalog anchors the older ones), `power_w` the board
power. The speeds are approximate, from public benchmark ratios (mixed-precision ResNet and
Transformer training): P100 ~0.57x a V100, a K80 die ~0.2x, T4 ~0.43x, A10 ~0.85x.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpu_arbiter.domain import Cluster, GpuType, Node, Rack

P100 = GpuType("P100", speed=0.2, power_w=250, memory_gib=16)
# One of the two GPUs on a K80 board (Gavel, like the schedulers it compares, counts dies).
K80 = GpuType("K80", speed=0.07, power_w=150, memory_gib=12)
T4 = GpuType("T4", speed=0.15, power_w=70, memory_gib=16)
A10 = GpuType("A10", speed=0.3, power_w=150, memory_gib=24)
V100M16 = GpuType("V100M16", speed=0.35, power_w=300, memory_gib=16)
V100M32 = GpuType("V100M32", speed=0.35, power_w=300, memory_gib=32)

# Host power (CPUs, memory, fans, NICs) of a node whose GPUs idle; older servers are smaller
# than the catalog's 1 kW H100 hosts.
HOST_IDLE_W = 300.0
# Rack caps are set this far above the nameplate draw of the rack's nodes: the traces carry no
# power limits, so a replay must never be constrained by one that was made up.
POWER_HEADROOM = 1.5


def pack_cluster(
    name: str,
    racks: Mapping[str, Sequence[tuple[str, str, int]]],
    gpu_types: Iterable[GpuType],
) -> Cluster:
    """Build a cluster from racks of (node name, GPU type, GPU count) with generous power caps.

    Every node gets `HOST_IDLE_W`; every rack's cap is `POWER_HEADROOM` times the full draw of
    its nodes. All racks sit in one pod: none of the traces describes a spine.
    """
    types = {t.name: t for t in gpu_types}
    rack_list: list[Rack] = []
    nodes: list[Node] = []
    for rack_name, members in racks.items():
        full_w = 0.0
        for node_name, gpu_type, gpus in members:
            nodes.append(
                Node(
                    name=node_name,
                    gpu_type=gpu_type,
                    gpus=gpus,
                    rack=rack_name,
                    idle_power_w=HOST_IDLE_W,
                )
            )
            full_w += HOST_IDLE_W + gpus * types[gpu_type].power_w
        rack_list.append(Rack(name=rack_name, power_cap_w=POWER_HEADROOM * full_w))
    return Cluster.build(name, nodes, rack_list, types.values())
