"""`make bench-traces`: every policy on every trace of a folder, one verdict table.

    python -m bench.trace_sweep DIR [--format gavel] [--cluster gavel:36:36:36]
                                    [--policies arbiter,fifo,...] [--seed 0] [--seeds 1]
                                    [--arrival-scale 1] [--tier-field auto]
                                    [--tier-map V=T,...] [--tier-mix 0.15,0.35,0.5]
                                    [--workers N]
                                    [--out bench/results/trace-sweep]

`arbiter bench` compares policies on one trace in depth; this asks the wider question of issue 3
— does Arbiter beat every baseline on mean JCT and on tier-1 P99 queueing delay (beside them:
what tier-1 jobs get, their mean JCT) — on every trace file under DIR (`*.trace`, `*.csv`,
searched recursively), one simulation per trace, policy and seed (`--seeds`: the KPIs are means
over them, as with `arbiter bench --seeds`; the seed draws the tiers and teams a trace lacks).
It writes `OUT/sweep.json` (each trace's KPIs per policy, or why it could not run) and
`OUT/sweep.md` (the verdicts: WIN, TIE or LOSS against the best baseline on each KPI, with the
margin), and prints the same table. Traces run in parallel (`--workers`, default the CPU count);
the Gavel `msr` folder (70 traces that fit the 108-GPU cluster) takes about 15 min per seed on 2
cores. The Alibaba v2023 pod lists run as `arbiter bench` runs them (`--format alibaba-v2023
--cluster alibaba-v2023@0.02 --arrival-scale 0.16`); the node lists beside them are no pod lists
and are reported as such.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from gpu_arbiter.cli.bench import DEFAULT_GAVEL_CLUSTER, parse_policies
from gpu_arbiter.cli.inputs import (
    ARRIVAL_SCALE_HELP,
    TIER_FIELD_HELP,
    TIER_MAP_HELP,
    TIER_MIX,
    TIER_MIX_HELP,
    Inputs,
    check_arrival_scale,
    load_inputs,
    trace_options,
)
from gpu_arbiter.domain import InvalidInput
from gpu_arbiter.engine.policies import POLICIES
from gpu_arbiter.sim import SimConfig, simulate
from gpu_arbiter.sim.faults import ReliabilityConfig
from gpu_arbiter.sim.report import KPIS as REPORT_KPIS
from gpu_arbiter.sim.report import Kpi, ties
from gpu_arbiter.traces.base import TraceOptions

OUT = Path(__file__).parent / "results" / "trace-sweep"
# The setting the Alibaba v2023 pod lists run at (`make bench-alibaba`, docs/results): a 2 %
# share of each GPU model's nodes, arrivals compressed to an offered load of about 0.74.
ALIBABA_CLUSTER = "alibaba-v2023@0.02"
ALIBABA_ARRIVAL_SCALE = 0.16
SUFFIXES = (".trace", ".csv")


def trace_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise InvalidInput(f"{folder}: not a folder of traces")
    files = sorted(p for p in folder.rglob("*") if p.suffix in SUFFIXES and p.is_file())
    if not files:
        raise InvalidInput(f"{folder}: no {' or '.join(SUFFIXES)} files in it")
    return files


@dataclass(frozen=True, slots=True)
class Measure:
    """A KPI the sweep judges: read as `arbiter bench`'s report reads it (`sim.report.KPIS`),
    kept under `key` in `unit`s (`per_unit` seconds each), called `label` in the summary."""

    key: str
    label: str
    kpi: Kpi
    per_unit: float
    unit: str

    def of(self, kpis: dict) -> float:
        return self.kpi.value(kpis) / self.per_unit


_REPORT = {k.label: k for k in REPORT_KPIS}
MEASURES = (
    Measure("avg_jct_h", "mean JCT", _REPORT["mean JCT"], 3600.0, "h"),
    Measure("tier1_p99_queue_min", "tier-1 P99", _REPORT["P99 queueing, tier 1"], 60.0, "min"),
    # Not one of issue 3's two KPIs: what tier 1 gets for a minute's queueing where Arbiter
    # waits for a victim's save on a fast type rather than start on a slow one.
    Measure("tier1_mean_jct_h", "tier-1 mean JCT", _REPORT["mean JCT, tier 1"], 3600.0, "h"),
)


def measure(inputs: Inputs, policy: str, seed: int) -> dict[str, float]:
    """One replay as `arbiter bench` runs it (failures on, drawn under `seed`): the sweep's
    KPIs by key (`MEASURES`)."""
    config = SimConfig(reliability=ReliabilityConfig(seed=seed))
    k = simulate(inputs.cluster, inputs.teams, policy, inputs.jobs, config).kpis
    return {m.key: m.of(k) for m in MEASURES}


def run_trace(
    path: Path,
    fmt: str,
    cluster: str,
    policies: list[str],
    seeds: list[int],
    arrival_scale: float = 1.0,
    reading: TraceOptions | None = None,
) -> dict[str, object]:
    """One trace under every policy and seed (the seed draws the trace's tiers and teams, and
    the failures): {"jobs", "policies": {name: {KPI: mean over the seeds, KPI_by_seed:
    [...]}}} or {"error": why}."""
    by_seed = {p: {m.key: [] for m in MEASURES} for p in policies}
    try:
        for seed in seeds:
            inputs = load_inputs(
                cluster,
                trace=path,
                fmt=fmt,
                seed=seed,
                reading=reading,
                arrival_scale=arrival_scale,
            )
            for name in policies:
                for key, value in measure(inputs, name, seed).items():
                    by_seed[name][key].append(value)
    except InvalidInput as e:
        return {"error": str(e)}
    kpis = {
        name: {
            **{k: statistics.fmean(v) for k, v in values.items()},
            **{f"{k}_by_seed": v for k, v in values.items()},
        }
        for name, values in by_seed.items()
    }
    return {"jobs": len(inputs.jobs), "policies": kpis}


def verdict(ours: float, best: float) -> str:
    if ties(ours, best):
        return "TIE"
    return "WIN" if ours < best else "LOSS"


def judge(row: dict[str, object], kpi: str) -> tuple[str, float, str, float] | None:
    """(verdict, Arbiter's value, best baseline, its value) on one KPI, or None."""
    kpis = row.get("policies")
    if not isinstance(kpis, dict) or "arbiter" not in kpis or len(kpis) < 2:
        return None
    ours = kpis["arbiter"][kpi]
    baseline = min((p for p in kpis if p != "arbiter"), key=lambda p: (kpis[p][kpi], p))
    best = kpis[baseline][kpi]
    return verdict(ours, best), ours, baseline, best


def table_rows(rows: list[dict[str, object]]) -> list[list[str]]:
    out = []
    for row in rows:
        if "error" in row:
            out.append([str(row["trace"]), "-", str(row["error"])] + [""] * (len(HEADER) - 3))
            continue
        cells = [str(row["trace"]), str(row["jobs"])]
        for m in MEASURES:
            j = judge(row, m.key)
            if j is None:
                cells += ["", ""]
                continue
            v, ours, baseline, best = j
            margin = f" ({(ours / best - 1) * 100:+.1f} %)" if best > 0 else ""
            cells += [f"{v}{margin}", f"{ours:.3f} {m.unit} vs {baseline} {best:.3f} {m.unit}"]
        out.append(cells)
    return out


HEADER = ["trace", "jobs"] + [c for m in MEASURES for c in (m.label, "Arbiter vs best")]


def summary(rows: list[dict[str, object]]) -> list[str]:
    """A line per KPI: how many traces Arbiter wins, ties and loses."""
    lines = []
    for m in MEASURES:
        tally = {"WIN": 0, "TIE": 0, "LOSS": 0}
        for row in rows:
            j = judge(row, m.key)
            if j is not None:
                tally[j[0]] += 1
        lines.append(f"{m.label}: {tally['WIN']} wins, {tally['TIE']} ties, {tally['LOSS']} losses")
    return lines


def markdown(meta: dict[str, object], rows: list[dict[str, object]]) -> str:
    lines = [
        f"# Trace sweep: {meta['folder']}",
        "",
        f"Cluster `{meta['cluster']}`, arrivals x{meta['arrival_scale']:g}, seeds "
        f"{', '.join(map(str, meta['seeds']))}, policies "
        f"{', '.join(meta['policies'])} (one simulation per trace, policy and seed; KPIs are "
        "means over the seeds). A verdict compares Arbiter with the best baseline on that "
        "trace.",
        "",
    ]
    lines += [f"Traces read with {meta['reading']}.", ""]
    lines += [f"- {line}" for line in summary(rows)]
    errors = sum(1 for r in rows if "error" in r)
    if errors:
        lines.append(f"- {errors} traces could not run on this cluster (reason in the table)")
    lines += ["", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(rows)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="folder of trace files (searched recursively)")
    parser.add_argument("--format", default="gavel", help="trace format (as `arbiter bench`)")
    parser.add_argument("--cluster", default=DEFAULT_GAVEL_CLUSTER)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--seeds", type=int, default=1, help="replay under --seed, --seed + 1, ...; KPIs are means"
    )
    parser.add_argument("--arrival-scale", type=float, default=1.0, help=ARRIVAL_SCALE_HELP)
    parser.add_argument("--tier-field", default="auto", help=TIER_FIELD_HELP)
    parser.add_argument("--tier-map", help=TIER_MAP_HELP)
    parser.add_argument("--tier-mix", default=TIER_MIX, help=TIER_MIX_HELP)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    console = Console()
    try:
        policies = parse_policies(args.policies)
        files = trace_files(args.folder)
        if args.seeds < 1:
            raise InvalidInput(f"--seeds must be at least 1, got {args.seeds}")
        check_arrival_scale(args.arrival_scale)
        reading = trace_options(
            tier_field=args.tier_field, tier_map=args.tier_map, tier_mix=args.tier_mix
        )
    except InvalidInput as e:
        parser.error(str(e))
    seeds = list(range(args.seed, args.seed + args.seeds))
    rows: list[dict[str, object]] = []
    columns = (
        "{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with (
        Progress(*columns, console=console) as progress,
        ProcessPoolExecutor(max(1, args.workers)) as pool,
    ):
        task = progress.add_task("traces", total=len(files))
        futures = {
            pool.submit(
                run_trace,
                f,
                args.format,
                args.cluster,
                policies,
                seeds,
                args.arrival_scale,
                reading,
            ): f
            for f in files
        }
        for future in as_completed(futures):
            row = {"trace": str(futures[future].relative_to(args.folder)), **future.result()}
            rows.append(row)
            progress.advance(task)
    rows.sort(key=lambda r: str(r["trace"]))
    meta = {
        "folder": str(args.folder),
        "cluster": args.cluster,
        "arrival_scale": args.arrival_scale,
        "reading": reading.describe(),
        "seeds": seeds,
        "policies": policies,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sweep.json").write_text(json.dumps({**meta, "traces": rows}, indent=1) + "\n")
    (args.out / "sweep.md").write_text(markdown(meta, rows))
    table = Table(*HEADER, title=f"{args.folder} on {args.cluster}")
    for cells in table_rows(rows):
        table.add_row(*cells)
    console.print(table)
    for line in summary(rows):
        console.print(line)
    console.print(f"wrote {args.out / 'sweep.json'} and {args.out / 'sweep.md'}")


if __name__ == "__main__":
    main()
