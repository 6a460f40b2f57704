"""What-if planning: the cluster's own history replayed as it was and under changes, side by side.

A `Scenario` is one column: the history's jobs on a cluster, with teams, a policy and a price
table. Each is replayed by the simulator (the same engine the service runs) and summed up by
`figures`: mean and P99 JCT and queueing by tier and by team, utilisation, goodput,
preemptions, each team's spend (the simulator's ledger) and the `arbiter tco` figures of a
cluster of that size used as the replay used it (`economy.tco.evaluate`). Rented cloud GPUs
(`cloud_gpus` at `cloud_price` per GPU-hour) are paid for every hour of the replay.

`write_whatif` lays out DIR/results.json (`{"kind": "whatif", "columns": {name: figures}}`),
DIR/report.md (one column per scenario) and DIR/queueing_by_team.png.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_arbiter.domain import Cluster, JobSpec, Team
from gpu_arbiter.economy import PriceTable
from gpu_arbiter.economy.chargeback import ChargeModel
from gpu_arbiter.economy.tco import TcoConfig, evaluate
from gpu_arbiter.engine import EngineConfig
from gpu_arbiter.metrics import JobRecord
from gpu_arbiter.metrics.kpis import percentile, show_duration
from gpu_arbiter.sim.economy import EconomyConfig
from gpu_arbiter.sim.simulator import SimConfig, simulate

BASELINE = "as it was"
PLOT = "queueing_by_team.png"


@dataclass(frozen=True)
class Scenario:
    name: str
    cluster: Cluster
    teams: list[Team]
    policy: str
    jobs: list[JobSpec]
    prices: PriceTable = field(default_factory=PriceTable)
    cloud_gpus: int = 0
    cloud_price: float = 0.0


def replay(scenario: Scenario, tco: TcoConfig, engine: EngineConfig) -> dict[str, Any]:
    """Replay one scenario. Live runs restart from their checkpoint with no modelled restore
    time, and failures are not injected: the history's own are in the jobs' kept work."""
    config = SimConfig(
        engine=engine,
        economy=EconomyConfig(model=ChargeModel(prices=scenario.prices)),
        reliability=None,
    )
    result = simulate(scenario.cluster, scenario.teams, scenario.policy, scenario.jobs, config)
    return figures(scenario, result.kpis, result.records, tco)


def work_done(scenario: Scenario, records: list[JobRecord]) -> float:
    """H100 GPU-hours of the work of the jobs that completed: the same wherever they ran."""
    done = {r.id for r in records if r.completed}
    return math.fsum(j.duration_s * j.gpus for j in scenario.jobs if j.id in done) / 3600.0


def _summary(records: list[JobRecord]) -> dict[str, float]:
    jct = [r.jct_s for r in records if r.jct_s is not None]
    wait = [r.queue_delay_s for r in records if r.queue_delay_s is not None]
    return {
        "jobs": len(records),
        "completed": sum(r.completed for r in records),
        "mean_jct_s": math.fsum(jct) / len(jct) if jct else 0.0,
        "p99_jct_s": percentile(jct, 99),
        "mean_queue_s": math.fsum(wait) / len(wait) if wait else 0.0,
        "p99_queue_s": percentile(wait, 99),
    }


def _grouped(records: list[JobRecord], key: Callable[[JobRecord], str]) -> dict[str, dict]:
    groups: dict[str, list[JobRecord]] = {}
    for r in records:
        groups.setdefault(key(r), []).append(r)
    return {k: _summary(v) for k, v in sorted(groups.items())}


def figures(
    scenario: Scenario, kpis: Mapping[str, Any], records: list[JobRecord], tco: TcoConfig
) -> dict[str, Any]:
    """What the capacity meeting compares, for one replay."""
    hours = kpis["makespan_s"] / 3600.0
    cloud_rent = scenario.cloud_gpus * scenario.cloud_price * hours
    utilisation, goodput = kpis["utilization"], kpis["goodput"]
    cost = None
    if utilisation > 0 and goodput > 0:
        year = evaluate(
            tco.model_copy(
                update={
                    "gpus": scenario.cluster.total_gpus,
                    "utilisation": min(utilisation, 1.0),
                    "goodput": min(goodput / utilisation, 1.0),
                }
            )
        )
        build = year.options[0]
        cost = {
            "currency": tco.currency,
            "cost_per_gpu_hour": build.cost_per_gpu_hour,
            "cost_per_useful_gpu_hour": build.cost_per_useful_gpu_hour,
            "best_option": year.best.name,
            "best_cost_per_useful_gpu_hour": year.best.cost_per_useful_gpu_hour,
        }
    return {
        "cluster": scenario.cluster.name,
        "gpus": scenario.cluster.total_gpus,
        "policy": scenario.policy,
        "all": _summary(records),
        "by_tier": _grouped(records, lambda r: str(r.tier)),
        "by_team": _grouped(records, lambda r: r.team),
        "utilisation": utilisation,
        "goodput": goodput,
        "useful_gpu_hours": kpis["useful_gpu_hours"],
        "work_done_h100_gpu_hours": work_done(scenario, records),
        "preemptions": kpis["preemptions"],
        "makespan_s": kpis["makespan_s"],
        "spend_by_team": {t: c["credits"] for t, c in kpis.get("cost_by_team", {}).items()},
        "cloud_gpus": scenario.cloud_gpus,
        "cloud_rent": cloud_rent,
        "tco": cost,
    }


def table_rows(columns: Mapping[str, dict]) -> list[tuple[str, list[str]]]:
    """(label, one cell per column) for every figure of the report."""
    first = next(iter(columns.values()))
    tiers = sorted({t for c in columns.values() for t in c["by_tier"]})
    teams = sorted({t for c in columns.values() for t in c["by_team"]})

    def each(show: Callable[[dict], str]) -> list[str]:
        out = []
        for c in columns.values():
            try:
                out.append(show(c))
            except (KeyError, TypeError):
                out.append("-")
        return out

    rows: list[tuple[str, list[str]]] = [
        ("cluster", each(lambda c: f"{c['cluster']} ({c['gpus']} GPUs)")),
        ("policy", each(lambda c: c["policy"])),
        ("jobs completed", each(lambda c: f"{c['all']['completed']} / {c['all']['jobs']}")),
        ("mean JCT", each(lambda c: show_duration(c["all"]["mean_jct_s"]))),
        ("P99 JCT", each(lambda c: show_duration(c["all"]["p99_jct_s"]))),
        ("mean queueing", each(lambda c: show_duration(c["all"]["mean_queue_s"]))),
        ("P99 queueing", each(lambda c: show_duration(c["all"]["p99_queue_s"]))),
    ]
    for group, names in (("tier", tiers), ("team", teams)):
        for name in names:
            key = f"by_{group}"
            for what, field_name in (
                ("mean JCT", "mean_jct_s"),
                ("P99 JCT", "p99_jct_s"),
                ("mean queueing", "mean_queue_s"),
                ("P99 queueing", "p99_queue_s"),
            ):
                rows.append(
                    (
                        f"{what}, {group} {name}",
                        each(lambda c, k=key, n=name, f=field_name: show_duration(c[k][n][f])),
                    )
                )
    rows += [
        ("utilisation", each(lambda c: f"{c['utilisation']:.1%}")),
        ("goodput", each(lambda c: f"{c['goodput']:.1%}")),
        ("useful GPU-hours", each(lambda c: f"{c['useful_gpu_hours']:.2f}")),
        ("work done (H100 GPU-hours)", each(lambda c: f"{c['work_done_h100_gpu_hours']:.2f}")),
        ("preemptions", each(lambda c: str(c["preemptions"]))),
    ]
    spenders = sorted({t for c in columns.values() for t in c["spend_by_team"]})
    rows += [
        (f"spend, team {t}", each(lambda c, t=t: f"{c['spend_by_team'][t]:.2f}")) for t in spenders
    ]
    rows.append(("cloud rent", each(lambda c: f"{c['cloud_rent']:.2f}")))
    if first["tco"] is not None:
        cur = first["tco"]["currency"]
        rows += [
            (
                f"cost per GPU-hour (build, {cur})",
                each(lambda c: f"{c['tco']['cost_per_gpu_hour']:.2f}"),
            ),
            (
                f"cost per useful GPU-hour (build, {cur})",
                each(lambda c: f"{c['tco']['cost_per_useful_gpu_hour']:.2f}"),
            ),
        ]
    return rows


def report_markdown(history: str, columns: Mapping[str, dict], notes: Iterable[str]) -> str:
    names = list(columns)
    lines = [
        f"# What if: {history}",
        "",
        *(f"- {n}" for n in notes),
        "",
        "| | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
        *(f"| {label} | " + " | ".join(cells) + " |" for label, cells in table_rows(columns)),
        "",
        f"![queueing delay by team]({PLOT})",
        "",
    ]
    return "\n".join(lines)


def plot_queueing_by_team(columns: Mapping[str, dict], path: Path) -> None:
    """Mean queueing delay per team, one bar per column; symlog y so 0 s still shows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    teams = sorted({t for c in columns.values() for t in c["by_team"]})
    fig, ax = plt.subplots(figsize=(max(6, 1.5 * len(teams) + 3), 4.5))
    width = 0.8 / max(len(columns), 1)
    x = np.arange(len(teams))
    for i, (name, c) in enumerate(columns.items()):
        values = [c["by_team"].get(t, {}).get("mean_queue_s", 0.0) for t in teams]
        ax.bar(x + i * width, values, width, label=name)
    ax.set_xticks(x + width * (len(columns) - 1) / 2, teams)
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_ylabel("mean queueing delay (s, symlog)")
    ax.set_title("Queueing delay by team, as it was and under each change")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_whatif(
    out: Path, history: str, columns: Mapping[str, dict], notes: list[str]
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.json"
    doc = {"kind": "whatif", "workload": history, "notes": notes, "columns": dict(columns)}
    results.write_text(json.dumps(doc, indent=2) + "\n")
    report = out / "report.md"
    report.write_text(report_markdown(history, columns, notes))
    plot = out / PLOT
    plot_queueing_by_team(columns, plot)
    return [results, report, plot]
