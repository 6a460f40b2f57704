"""A policy comparison written to a directory: one replay of one workload under several policies.

`write_bench` lays out

* `results.json` — `{"workload": ..., "trace": ..., "cluster": ..., "policies": {name: kpis}}`,
  where each `kpis` is exactly the object `arbiter simulate --json` prints for that policy (at
  the first seed) and `policies` keeps the order the policies were asked for; `trace` is the
  read summary (`null` for a synthetic workload). A replay under several seeds adds `by_seed`
  (`{seed: {name: kpis}}`) and `across_seeds` (`{name: {kpi label: {mean, min, max}}}` over the
  KPIs of the report);
* `report.md` — the KPI table (one column per policy, the best policy per KPI), the read
  summary and links to the plots; under several seeds first a table of each KPI's mean and
  range over them, as one seed's tier and team draws can move a tail KPI a long way;
* `<policy>/records.csv` — one row per job, to dig into what a KPI hides;
* `jct_cdf.png`, `queue_delay_by_tier.png`, `utilization_goodput.png` (see `sim/plots.py`).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpu_arbiter.metrics import JobRecord
from gpu_arbiter.metrics.kpis import percentile, show_duration
from gpu_arbiter.sim.plots import PLOTS
from gpu_arbiter.sim.simulator import SimResult
from gpu_arbiter.traces.base import ReadStats, TraceOptions

RECORD_FIELDS = (
    "id",
    "team",
    "tier",
    "gpus",
    "gpu_type",
    "submit_s",
    "first_start_s",
    "finish_s",
    "jct_s",
    "queue_delay_s",
    "preemptions",
    "restarts",
    "completed",
)


@dataclass(frozen=True, slots=True)
class BenchSource:
    """What was replayed: `workload` names it (a trace path or `synthetic:N`), `stats` is the
    trace read summary and `options` how it was read (both None for a synthetic workload),
    `arrival_scale` the factor on the trace's arrival times."""

    workload: str
    fmt: str | None
    stats: ReadStats | None
    seed: int
    options: TraceOptions | None = None
    arrival_scale: float = 1.0
    # What the replayed jobs really waited, when the trace is the cluster's own history.
    real_queue_delays: tuple[float, ...] | None = None


@dataclass(frozen=True, slots=True)
class Kpi:
    """A row of the report: how to read the value, how to show it, and which way is better."""

    label: str
    value: Callable[[dict], float]
    show: Callable[[float], str]
    lower_is_better: bool = True


def _pct(x: float) -> str:
    return f"{x:.1%}"


def _tier(key: str, tier: str) -> Callable[[dict], float]:
    return lambda k: k[key][tier]


def _tier_mean_jct(tier: str) -> Callable[[dict], float]:
    return lambda k: k["jct_by_tier"][tier]["mean_jct_s"]


KPIS: tuple[Kpi, ...] = (
    Kpi("mean JCT", lambda k: k["avg_jct_s"], show_duration),
    Kpi("P50 JCT", lambda k: k["p50_jct_s"], show_duration),
    Kpi("P99 JCT", lambda k: k["p99_jct_s"], show_duration),
    # What the tiers buy: a policy that honours them may lose mean JCT to one that does not
    # (tier 3 waits for tiers 1 and 2) while finishing tiers 1 and 2 sooner.
    *(Kpi(f"mean JCT, tier {t}", _tier_mean_jct(t), show_duration) for t in ("1", "2", "3")),
    *(
        Kpi(f"P99 queueing, tier {t}", _tier("p99_queue_delay_s_by_tier", t), show_duration)
        for t in ("1", "2", "3")
    ),
    *(
        Kpi(f"P50 queueing, tier {t}", _tier("p50_queue_delay_s_by_tier", t), show_duration)
        for t in ("1", "2", "3")
    ),
    Kpi("utilisation", lambda k: k["utilization"], _pct, lower_is_better=False),
    Kpi("goodput", lambda k: k["goodput"], _pct, lower_is_better=False),
    Kpi("preemptions", lambda k: k["preemptions"], lambda x: f"{x:.0f}"),
    Kpi("tier-1 preempted", lambda k: k["tier1_preempted"], lambda x: f"{x:.0f}"),
    Kpi("fragmentation", lambda k: k["fragmentation"], _pct),
    Kpi("SLA attainment", lambda k: k["sla_attainment"], _pct, lower_is_better=False),
    Kpi("unfinished jobs", lambda k: k["unfinished"], lambda x: f"{x:.0f}"),
)


def best_policies(kpi: Kpi, kpis: Mapping[str, dict]) -> list[str]:
    """Every policy that ties for the best value of `kpi` (ties are common: 0 s queueing)."""
    return _best({name: kpi.value(k) for name, k in kpis.items()}, kpi.lower_is_better)


def ties(a: float, b: float) -> bool:
    """Whether two values of a KPI tie: equal to a millionth, so that the floating-point noise
    of sums and means over seeds does not make a winner (`arbiter bench` and the trace sweep
    judge alike)."""
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def _best(values: Mapping[str, float], lower_is_better: bool) -> list[str]:
    best = min(values.values()) if lower_is_better else max(values.values())
    return [name for name, v in values.items() if ties(v, best)]


Runs = Mapping[int, Mapping[str, SimResult]]  # seed -> policy -> result


def across_seeds(runs: Runs) -> dict[str, dict[str, dict[str, float]]]:
    """Per policy and report KPI, its mean, min and max over the seeds."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name in next(iter(runs.values())):
        out[name] = {}
        for kpi in KPIS:
            values = [kpi.value(by_policy[name].kpis) for by_policy in runs.values()]
            out[name][kpi.label] = {
                "mean": sum(values) / len(values),
                "min": min(values),
                "max": max(values),
            }
    return out


def results_json(
    source: BenchSource, results: Mapping[str, SimResult], runs: Runs | None = None
) -> dict:
    first = next(iter(results.values())).kpis
    stats = source.stats
    several = runs is not None and len(runs) > 1
    return {
        "workload": source.workload,
        "format": source.fmt,
        "seed": source.seed,
        "trace": None
        if stats is None
        else {
            "source": stats.source,
            "rows": stats.rows,
            "jobs": stats.jobs,
            "skipped": dict(stats.skipped),
            "bad": dict(stats.bad),
            "tiers": dict(stats.tiers),
            "summary": stats.summary(),
            "arrival_scale": source.arrival_scale,
            **({} if source.options is None else _options_json(source.options)),
        },
        "cluster": {"name": first["cluster"], "gpus": first["gpus"]},
        "policies": {name: r.kpis for name, r in results.items()},
        **(
            {}
            if source.real_queue_delays is None
            else {"queueing_real_vs_replayed": replay_fidelity(source.real_queue_delays, results)}
        ),
        **(
            {
                "by_seed": {
                    str(seed): {name: r.kpis for name, r in by_policy.items()}
                    for seed, by_policy in runs.items()
                },
                "across_seeds": across_seeds(runs),
            }
            if several
            else {}
        ),
    }


def queueing(delays: Iterable[float]) -> dict[str, float]:
    """Mean and P99 of queueing delays (0 for none), and how many there were."""
    values = list(delays)
    mean = math.fsum(values) / len(values) if values else 0.0
    return {"jobs": len(values), "mean_s": mean, "p99_s": percentile(values, 99)}


def replay_fidelity(real: Iterable[float], results: Mapping[str, SimResult]) -> dict:
    """How closely each replay reproduces the queueing the jobs really saw."""
    return {
        "real": queueing(real),
        "replayed": {
            name: queueing(x.queue_delay_s for x in r.records if x.queue_delay_s is not None)
            for name, r in results.items()
        },
    }


def _fidelity_table(fidelity: dict) -> list[str]:
    real = fidelity["real"]
    lines = [
        "## Real against replayed queueing",
        "",
        f"The jobs of the history ({real['jobs']} that started) as they really waited, and as "
        "each replay on the same cluster made them wait.",
        "",
        "| | mean queueing | P99 queueing |",
        "|---|---:|---:|",
        f"| real | {show_duration(real['mean_s'])} | {show_duration(real['p99_s'])} |",
    ]
    for name, q in fidelity["replayed"].items():
        lines.append(
            f"| {name} (replayed) | {show_duration(q['mean_s'])} | {show_duration(q['p99_s'])} |"
        )
    return [*lines, ""]


def _options_json(options: TraceOptions) -> dict:
    """The reading choices that decide who the jobs are (the seed is the report's)."""
    return {
        "tier_field": options.tier_field,
        "tier_map": None if options.tier_map is None else dict(options.tier_map),
        "tier_mix": list(options.tier_mix),
        "team_field": options.team_field,
        "walltime": options.walltime,
        "assignment": options.describe(),
    }


def _kpi_table(
    names: list[str],
    cell: Callable[[Kpi, str], str],
    value: Callable[[Kpi, str], float],
) -> list[str]:
    """A markdown table: a row per report KPI, a column per policy, and the best of each row
    by `value` (kpi, policy)."""
    lines = [
        "| KPI | " + " | ".join(names) + " | best |",
        "|---|" + "---:|" * len(names) + "---|",
    ]
    for kpi in KPIS:
        best = _best({n: value(kpi, n) for n in names}, kpi.lower_is_better)
        best_text = "all" if len(best) == len(names) else ", ".join(best)
        row = " | ".join(cell(kpi, n) for n in names)
        lines.append(f"| {kpi.label} | {row} | {best_text} |")
    return lines


def _seeds_table(runs: Runs) -> list[str]:
    """Each KPI's mean over the seeds with its range; the best by the mean."""
    spread = across_seeds(runs)

    def cell(kpi: Kpi, name: str) -> str:
        s = spread[name][kpi.label]
        return f"{kpi.show(s['mean'])} ({kpi.show(s['min'])} – {kpi.show(s['max'])})"

    seeds = ", ".join(str(s) for s in runs)
    return [
        f"## Across seeds {seeds}: mean (min – max)",
        "",
        *_kpi_table(list(spread), cell, lambda kpi, n: spread[n][kpi.label]["mean"]),
        "",
        f"## Seed {next(iter(runs))}",
        "",
    ]


def report_markdown(
    source: BenchSource, results: Mapping[str, SimResult], runs: Runs | None = None
) -> str:
    kpis = {name: r.kpis for name, r in results.items()}
    first = next(iter(kpis.values()))
    names = list(kpis)
    several = runs is not None and len(runs) > 1
    seeds = ", ".join(str(s) for s in runs) if several else str(source.seed)
    lines = [
        f"# Policy comparison: {source.workload}",
        "",
        f"- cluster: {first['cluster']} ({first['gpus']} GPUs)",
        f"- jobs: {first['jobs']}; seed{'s' if several else ''} {seeds}",
    ]
    if source.stats is not None:
        lines.append(f"- trace read ({source.fmt}): {source.stats.summary()}")
    if source.options is not None:
        lines.append(f"- {source.options.describe()}")
    if source.arrival_scale != 1.0:
        lines.append(f"- arrival times x{source.arrival_scale:g}")
    lines.append("")
    if several:
        lines += _seeds_table(runs)
    lines += _kpi_table(
        names,
        lambda kpi, n: kpi.show(kpi.value(kpis[n])),
        lambda kpi, n: kpi.value(kpis[n]),
    )
    if source.real_queue_delays is not None:
        lines += ["", *_fidelity_table(replay_fidelity(source.real_queue_delays, results))]
    lines += [
        "",
        "Simulated in: " + ", ".join(f"{n} {kpis[n]['sim_wall_s']:.1f} s" for n in names) + ".",
        "",
        "## Plots",
        "",
        *(f"![{title}]({file})" for file, (title, _) in PLOTS.items()),
        "",
        "## Job records",
        "",
        *(f"- [{n}]({n}/records.csv)" for n in names),
        "",
    ]
    return "\n".join(lines)


def write_records(path: Path, records: list[JobRecord]) -> None:
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(RECORD_FIELDS)
        for r in records:
            out.writerow(
                (
                    r.id,
                    r.team,
                    r.tier,
                    r.gpus,
                    r.gpu_type or "",
                    r.submit_s,
                    "" if r.first_start is None else r.first_start,
                    "" if r.finished_at is None else r.finished_at,
                    "" if r.jct_s is None else r.jct_s,
                    "" if r.queue_delay_s is None else r.queue_delay_s,
                    r.preemptions,
                    r.restarts,
                    int(r.completed),
                )
            )


def write_bench(
    out: Path, source: BenchSource, results: Mapping[str, SimResult], runs: Runs | None = None
) -> list[Path]:
    """Write the whole results directory; returns the files written. `results` are the runs at
    `source.seed` (records and plots come from them); `runs` all of them by seed, when the
    workload was replayed under several."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    path = out / "results.json"
    data = results_json(source, results, runs)
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    written.append(path)
    path = out / "report.md"
    path.write_text(report_markdown(source, results, runs))
    written.append(path)
    for name, result in results.items():
        (out / name).mkdir(exist_ok=True)
        path = out / name / "records.csv"
        write_records(path, result.records)
        written.append(path)
    for file, (_, draw) in PLOTS.items():
        path = out / file
        draw(results, path)
        written.append(path)
    return written
