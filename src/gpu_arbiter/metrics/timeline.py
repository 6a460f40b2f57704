"""Utilisation and goodput over time, from run segments binned with numpy."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Segment:
    """A job held `gpus` GPUs from `start` to `end`; `useful_gpu_s` of that time was kept."""

    start: float
    end: float
    gpus: int
    useful_gpu_s: float


def timeline(
    segments: list[Segment], total_gpus: int, start_s: float, end_s: float, bins: int = 200
) -> dict[str, list[float]]:
    """Per bin: utilisation and goodput as shares of capacity. Useful time is spread evenly over
    its segment (a checkpointed segment's kept and lost parts are not told apart in time)."""
    edges = np.linspace(start_s, max(end_s, start_s + 1e-9), bins + 1)
    busy = np.zeros(bins)
    useful = np.zeros(bins)
    for seg in segments:
        if seg.end <= seg.start:
            continue
        lo = np.clip(edges[:-1], seg.start, seg.end)
        hi = np.clip(edges[1:], seg.start, seg.end)
        overlap = hi - lo
        busy += overlap * seg.gpus
        useful += overlap * (seg.useful_gpu_s / (seg.end - seg.start))
    width = (edges[1] - edges[0]) * total_gpus
    return {
        "t": [float(x) for x in edges[:-1]],
        "utilization": [float(x) for x in busy / width],
        "goodput": [float(x) for x in useful / width],
    }
