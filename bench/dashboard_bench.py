"""What the dashboard and the failure model cost, against the budgets they live in.

- The snapshot copy of a 10,240-GPU engine with 2,000 jobs runs on the control loop, which
  ticks every `ServerConfig.tick_s`: its time is reported as a share of one tick.
- The heatmap view of 10,240 GPUs is built for every dashboard poll (`POLL_MS` in app.js):
  its time is reported as a share of one poll.
- A year of faults for the 100k-GPU `large` preset is drawn before a simulation starts.

The fixtures are the tests' own (`tests/web/clusters.py`), so the benchmark times what the
tests check.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_arbiter.control.config import ServerConfig
from gpu_arbiter.domain.presets import large
from gpu_arbiter.reliability import FailureModel
from gpu_arbiter.reliability.failures import YEAR_S
from gpu_arbiter.web import snapshot
from gpu_arbiter.web.views import Viewer, heatmap_view
from tests.web.clusters import big_cluster, ten_thousand_gpu_loop

POLL_S = 2.0  # the dashboard's poll interval (POLL_MS in web/static/app.js)


def _timed(call: Callable[[], Any], repeat: int) -> dict[str, float]:
    """Median and slowest wall time of `repeat` calls, in milliseconds."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return {"median_ms": 1000 * statistics.median(times), "max_ms": 1000 * max(times)}


def dashboard_costs(repeat: int = 20) -> list[dict[str, Any]]:
    loop = ten_thousand_gpu_loop()
    snap = big_cluster()
    admin = Viewer("admin", None)
    cluster = large()
    tick_s = ServerConfig(state_dir=Path(".")).tick_s
    rows = [
        ("snapshot copy, 10,240 GPUs", lambda: snapshot.copy(loop, 2.0), repeat, tick_s),
        ("heatmap view, 10,240 GPUs", lambda: heatmap_view(snap, admin), repeat, POLL_S),
        (
            f"fault schedule, {cluster.total_gpus:,} GPUs x 1 year",
            lambda: FailureModel(seed=2).schedule(cluster, YEAR_S),
            max(1, repeat // 4),
            None,
        ),
    ]
    out = []
    for name, call, n, budget_s in rows:
        timing = _timed(call, n)
        share = timing["max_ms"] / 1000 / budget_s if budget_s else None
        out.append({"what": name, "runs": n, **timing, "budget_s": budget_s, "share": share})
    return out
