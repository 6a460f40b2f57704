"""The plots of a policy comparison, drawn headless (matplotlib's Agg backend, no display).

Each plot takes the runs by policy name and a path, and writes one PNG; `PLOTS` maps the file
name to its title and drawing function, so the report links exactly what was drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402

from gpu_arbiter.sim.simulator import SimResult  # noqa: E402

TIERS = ("1", "2", "3")


def jct_cdf(results: Mapping[str, SimResult], path: Path) -> None:
    """Completion-time CDF per policy, log x: JCTs span seconds to weeks."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, r in results.items():
        jct = np.sort([max(x.jct_s, 1.0) for x in r.records if x.jct_s is not None])
        if jct.size:
            ax.step(jct, np.arange(1, jct.size + 1) / jct.size, where="post", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (s, log scale)")
    ax.set_ylabel("fraction of completed jobs")
    ax.set_ylim(0, 1.01)
    ax.set_title("JCT CDF per policy")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def queue_delay_by_tier(results: Mapping[str, SimResult], path: Path) -> None:
    """P50 and P99 queueing delay per tier, one bar per policy; symlog y so 0 s still shows."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    names = list(results)
    width = 0.8 / max(len(names), 1)
    x = np.arange(len(TIERS))
    for ax, q in zip(axes, ("p50", "p99"), strict=True):
        for i, name in enumerate(names):
            delays = results[name].kpis[f"{q}_queue_delay_s_by_tier"]
            ax.bar(x + i * width, [delays[t] for t in TIERS], width, label=name)
        ax.set_xticks(x + width * (len(names) - 1) / 2, [f"tier {t}" for t in TIERS])
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_title(f"{q.upper()} queueing delay")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("queueing delay (s, symlog scale)")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def utilization_goodput(results: Mapping[str, SimResult], path: Path) -> None:
    """Utilisation and goodput over time, from each run's binned timeline."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for name, r in results.items():
        t = np.asarray(r.timeline["t"])
        hours = (t - t[0]) / 3600 if t.size else t
        top.plot(hours, 100 * np.asarray(r.timeline["utilization"]), label=name)
        bottom.plot(hours, 100 * np.asarray(r.timeline["goodput"]), label=name)
    top.set_ylabel("utilisation (% of GPUs)")
    bottom.set_ylabel("goodput (% of GPUs)")
    bottom.set_xlabel("time since first submission (h)")
    top.set_title("Utilisation and goodput over time")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    top.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


PLOTS: dict[str, tuple[str, Callable[[Mapping[str, SimResult], Path], None]]] = {
    "jct_cdf.png": ("JCT CDF per policy", jct_cdf),
    "queue_delay_by_tier.png": ("Queueing delay by tier", queue_delay_by_tier),
    "utilization_goodput.png": ("Utilisation and goodput over time", utilization_goodput),
}
