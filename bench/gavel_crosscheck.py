"""`make bench-gavel`: the `gavel` baseline beside the real Gavel simulator (issue 49).

    python -m bench.gavel_crosscheck [--msr DIR] [--settings gavel,arbiter] [--traces 2869ce,...]

Replays Gavel's msr traces 2869ce and 0e4a51 (DIR/seed=0) on the 36:36:36 V100:P100:K80
cluster under the `gavel` policy, with the allocation reset at most every 1920 s (Gavel's
default) and every round, and prints the mean JCT beside what the real Gavel simulator gave
(`REAL`: stanford-futuredata/gavel at c4fa400, policy `max_min_fairness_perf`, seed 0, fed the
same per-GPU throughputs, scaled linearly with GPU count; issue 49). Two settings:

- `gavel`: as Gavel's simulator runs, no failures, suspending and resuming take no time, no
  billing;
- `arbiter`: as `arbiter bench` and `make bench-traces` run every policy, with failures at
  SPEC F3's rates (seed 0), a minute to save and a minute to restore.

Writes bench/results/gavel-crosscheck.json. About 8 minutes on 2 cores (0e4a51 is 1181 jobs
over 85 days).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gpu_arbiter.cli.inputs import load_inputs
from gpu_arbiter.engine import EngineConfig
from gpu_arbiter.engine.policies.gavel import RESET_INTERVAL_S, GavelPolicy
from gpu_arbiter.sim import SimConfig, Simulator
from gpu_arbiter.sim.faults import ReliabilityConfig

OUT = Path(__file__).parent / "results" / "gavel-crosscheck.json"
MSR = Path("../shared/traces/gavel/traces/msr")  # from the repository root, as in the Makefile
CLUSTER = "gavel:36:36:36"
# Mean JCT in hours of the real Gavel simulator, by trace and reset interval (0: every round).
REAL = {
    ("2869ce", RESET_INTERVAL_S): 4.757,
    ("2869ce", 0.0): 3.787,
    ("0e4a51", RESET_INTERVAL_S): 64.71,
    ("0e4a51", 0.0): 64.15,
}
SETTINGS = {
    "gavel": SimConfig(
        engine=EngineConfig(notice_stop_s=0.0, restart_overhead_s=0.0),
        reliability=None,
        economy=None,
    ),
    "arbiter": SimConfig(reliability=ReliabilityConfig(seed=0)),
}


def crosscheck(msr: Path, trace: str, reset_s: float, setting: str) -> dict:
    """One run of the `gavel` policy; its mean JCT beside the real Gavel's."""
    inputs = load_inputs(CLUSTER, trace=msr / "seed=0" / f"{trace}.trace", fmt="gavel", seed=0)
    policy = GavelPolicy(reset_interval_s=reset_s)
    wall = time.perf_counter()
    result = Simulator(inputs.cluster, inputs.teams, policy, inputs.jobs, SETTINGS[setting]).run()
    mean_h = result.kpis["avg_jct_s"] / 3600.0
    real = REAL[(trace, reset_s)]
    return {
        "trace": trace,
        "reset": "every round" if reset_s == 0 else f"{reset_s:g} s",
        "setting": setting,
        "jobs": len(inputs.jobs),
        "unfinished": result.kpis["unfinished"],
        "mean_jct_h": round(mean_h, 3),
        "real_gavel_h": real,
        "off": round(mean_h / real - 1, 4),
        "unplaced": policy.unplaced,
        "wall_s": round(time.perf_counter() - wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--msr", type=Path, default=MSR, help="Gavel's traces/msr folder")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="gavel, arbiter or both")
    parser.add_argument("--traces", default="2869ce,0e4a51", help="msr traces of seed=0")
    args = parser.parse_args()
    console = Console(width=120)
    rows = []
    for trace in args.traces.split(","):
        for setting in args.settings.split(","):
            for reset_s in (RESET_INTERVAL_S, 0.0):
                with console.status(f"{trace}, {setting} setting, reset {reset_s:g} s ..."):
                    rows.append(crosscheck(args.msr, trace, reset_s, setting))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(rows, indent=2))
    table = Table(title=f"`gavel` against the real Gavel simulator ({CLUSTER}, seed 0)")
    columns = ("trace", "reset", "setting", "jobs", "mean JCT h", "real Gavel h", "off")
    for col in (*columns, "unplaced", "wall s"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["trace"],
            r["reset"],
            r["setting"],
            str(r["jobs"] - r["unfinished"]),
            f"{r['mean_jct_h']:.3f}",
            f"{r['real_gavel_h']:.3f}",
            f"{r['off']:+.1%}",
            str(r["unplaced"]),
            f"{r['wall_s']:.0f}",
        )
    console.print(table)
    console.print(
        "jobs: finished (real Gavel counted 1-6 fewer: multi-GPU jobs it dropped as failed); "
        "unplaced: job-rounds a chosen job found no room to start in (Gavel has no topology)"
    )
    console.print(f"results written to {OUT}")


if __name__ == "__main__":
    main()
