"""Utilisation and goodput over time, from run segments binned with numpy."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_BLOCK = 4096  # segments binned at once


@dataclass(frozen=True, slots=True)
class Segment:
    """A job held `gpus` GPUs from `start` to `end`; `useful_gpu_s` of that time was kept."""

    start: float
    end: float
    gpus: float
    useful_gpu_s: float

    @classmethod
    def whole(cls, start: float, end: float, gpus: float, useful: bool = True) -> Segment:
        """A segment whose GPU time was all kept (`useful`) or all lost (to a failure)."""
        return cls(start, end, gpus, (end - start) * gpus if useful else 0.0)


def timeline(
    segments: list[Segment], total_gpus: int, start_s: float, end_s: float, bins: int = 200
) -> dict[str, list[float]]:
    """Per bin (from its start `t`): utilisation and goodput as shares of capacity (0 with no
    GPUs). Useful time is spread evenly over its segment (a checkpointed segment's kept and
    lost parts are not told apart in time)."""
    edges = np.linspace(start_s, max(end_s, start_s + 1e-9), bins + 1)
    busy = np.zeros(bins)
    useful = np.zeros(bins)
    held = [s for s in segments if s.end > s.start]
    # Segments by the block (a 100k-job run has over 100k): each block's overlap with every
    # bin is one (segments x bins) array.
    for i in range(0, len(held), _BLOCK):
        block = held[i : i + _BLOCK]
        start = np.array([s.start for s in block])[:, None]
        end = np.array([s.end for s in block])[:, None]
        overlap = np.clip(edges[1:], start, end) - np.clip(edges[:-1], start, end)
        busy += np.array([s.gpus for s in block], dtype=float) @ overlap
        rate = np.array([s.useful_gpu_s for s in block]) / (end[:, 0] - start[:, 0])
        useful += rate @ overlap
    capacity = (edges[1] - edges[0]) * total_gpus  # GPU seconds per bin (none: no GPUs up)
    scale = 1 / capacity if capacity else 0.0
    return {
        "t": [float(x) for x in edges[:-1]],
        "utilization": [float(x) for x in busy * scale],
        "goodput": [float(x) for x in useful * scale],
    }
