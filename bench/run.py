"""`make bench`: run the benchmarks, write bench/results/*.json and print readable tables.

    python -m bench.run [--quick]

--quick shrinks every benchmark (for a smoke run); the figures in the README come from the
full run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.dashboard_bench import dashboard_costs
from bench.engine_bench import cycle_latency, placement_speedup, sim_throughput

OUT = Path(__file__).parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--sim-jobs", type=int, help="synthetic jobs for the simulator run")
    args = parser.parse_args()
    console = Console()
    OUT.mkdir(parents=True, exist_ok=True)
    running, pending, cycles, jobs = (
        (500, 1000, 30, 2000) if args.quick else (5000, 10_000, 200, 100_000)
    )
    jobs = args.sim_jobs or jobs
    with console.status("scheduling cycles on the large preset ..."):
        latency = [cycle_latency(p, running, pending, cycles) for p in ("arbiter", "backfill")]
    with console.status("indexed placement vs a scan ..."):
        placement = placement_speedup(100 if args.quick else 300)
    with console.status(f"simulating {jobs:,} jobs on the medium preset ..."):
        throughput = sim_throughput(jobs)
    with console.status("dashboard views and the failure model at scale ..."):
        dashboard = dashboard_costs(5 if args.quick else 20)
    results = {
        "cycle_latency": latency,
        "placement": placement,
        "sim_throughput": throughput,
        "dashboard": dashboard,
    }
    (OUT / "engine.json").write_text(json.dumps(results, indent=2))

    rows = [
        (
            r["policy"],
            str(r["running"]),
            str(r["pending"]),
            f"{r['p50_cycle_ms']:.2f}",
            f"{r['p99_cycle_ms']:.2f}",
            f"{r['decisions_per_s']:,.0f}",
        )
        for r in latency
    ]
    columns = ("policy", "running", "pending", "p50 ms", "p99 ms", "decisions/s")
    console.print(_table("Scheduling cycle on `large` (100k GPUs)", columns, rows))
    ratio = latency[0]["p99_cycle_ms"] / latency[1]["p99_cycle_ms"]
    console.print(f"arbiter / backfill p99 cycle time: {ratio:.2f}x")
    console.print(
        f"placement: indexed {placement['indexed_us']:.1f} us vs scan {placement['scan_us']:.1f} us"
        f" per request ({placement['speedup']:.0f}x faster)"
    )
    rows = [
        (
            r["policy"],
            f"{r['jobs']:,}",
            f"{r['completed']:,}",
            f"{r['cycles']:,}",
            f"{r['wall_s']:.1f}",
            f"{r['jobs_per_s']:,.0f}",
        )
        for r in throughput
    ]
    columns = ("policy", "jobs", "completed", "cycles", "wall s", "jobs/s")
    console.print(_table("Simulator throughput on `medium`", columns, rows))
    rows = [
        (
            r["what"],
            str(r["runs"]),
            f"{r['median_ms']:.1f}",
            f"{r['max_ms']:.1f}",
            f"{r['share']:.1%} of {r['budget_s']:g} s" if r["share"] is not None else "-",
        )
        for r in dashboard
    ]
    columns = ("work", "runs", "median ms", "max ms", "slowest, of its budget")
    console.print(_table("Dashboard and failure model", columns, rows))
    console.print(f"results written to {OUT / 'engine.json'}")


def _table(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> Table:
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(*row)
    return table


if __name__ == "__main__":
    main()
