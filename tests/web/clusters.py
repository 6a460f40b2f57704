"""Synthetic snapshots too large to write by hand."""

from __future__ import annotations

from gpu_arbiter.web.snapshot import Holding, NodeState, Snapshot


def big_cluster(racks: int = 40, nodes_per_rack: int = 32, gpus: int = 8) -> Snapshot:
    """10,240 GPUs, a quarter of them free and a few nodes failed."""
    nodes, holdings = [], {}
    for r in range(racks):
        for i in range(nodes_per_rack):
            name = f"r{r:02d}n{i:02d}"
            state = "down" if (r * nodes_per_rack + i) % 97 == 0 else "up"
            busy = (r + i) % 4
            free = (1 << gpus) - 1 if not busy and state == "up" else 0
            nodes.append(NodeState(name, f"rack{r:02d}", "H100", gpus, gpus, state, "", free))
            if busy and state == "up":
                tier = 1 + (r + i) % 3
                holdings[name] = (
                    Holding(f"j{r}-{i}", "t", tier, busy == 3, False, tuple(range(gpus))),
                )
    return Snapshot(now=0.0, nodes=tuple(nodes), holdings=holdings)
