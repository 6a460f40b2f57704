"""`arbiter simulate`: replay a workload under one policy and print its KPIs.

`--out DIR` also keeps the run: DIR/kpis.json (what `--json` prints), DIR/ledger.jsonl and
DIR/usage.json, so `arbiter bill --from-sim DIR` can bill it afterwards.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpu_arbiter.cli.bench import real_delays
from gpu_arbiter.cli.inputs import (
    ARRIVAL_SCALE_HELP,
    CLUSTER_HELP,
    NOTICE_STOP_HELP,
    NOTICE_STOP_S,
    TIER_MIX,
    LimitOption,
    StrictOption,
    TeamFieldOption,
    TierFieldOption,
    TierMapOption,
    TierMixOption,
    WalltimeOption,
    engine_config,
    load_inputs,
    load_teams,
    trace_options,
    with_budget,
)
from gpu_arbiter.domain import InvalidInput
from gpu_arbiter.economy import BudgetPolicy
from gpu_arbiter.engine import Policy, get_policy
from gpu_arbiter.engine.policies import GavelPolicy
from gpu_arbiter.metrics.kpis import show_duration
from gpu_arbiter.reliability import Action, BreakerPolicy
from gpu_arbiter.reliability.stragglers import StragglerConfig
from gpu_arbiter.sim import EconomyConfig, SimConfig, SimResult
from gpu_arbiter.sim import simulate as run_simulation
from gpu_arbiter.sim.faults import ReliabilityConfig
from gpu_arbiter.sim.report import replay_fidelity


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)


def simulate(
    workload: Annotated[
        str, typer.Option(help="synthetic:N — N seeded synthetic jobs (ignored with --trace).")
    ] = "synthetic:1000",
    seed: Annotated[
        int, typer.Option(help="Seed of the workload (and of trace tier/team draws).")
    ] = 0,
    policy: Annotated[
        str, typer.Option(help="fifo, backfill, tiresias, gavel or arbiter.")
    ] = "arbiter",
    gavel_reset: Annotated[
        float | None,
        typer.Option(
            help="With --policy gavel: seconds at least between recomputations of its LP "
            "allocation (Gavel's own default 1920; 0 recomputes every round)."
        ),
    ] = None,
    cluster: Annotated[str, typer.Option(help=CLUSTER_HELP)] = "small",
    load: Annotated[float, typer.Option(help="Offered load of the synthetic workload.")] = 0.9,
    trace: Annotated[Path | None, typer.Option(help="Replay this trace file instead.")] = None,
    fmt: Annotated[str | None, typer.Option("--format", help="Format of --trace.")] = None,
    strict: StrictOption = False,
    limit: LimitOption = None,
    tier_field: TierFieldOption = "auto",
    tier_map: TierMapOption = None,
    tier_mix: TierMixOption = TIER_MIX,
    team_field: TeamFieldOption = "auto",
    walltime: WalltimeOption = "round-hour",
    arrival_scale: Annotated[float, typer.Option(help=ARRIVAL_SCALE_HELP)] = 1.0,
    notice_stop: Annotated[float, typer.Option(help=NOTICE_STOP_HELP)] = NOTICE_STOP_S,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    failures: Annotated[
        bool, typer.Option(help="Inject seeded node failures (F3); --no-failures turns them off.")
    ] = True,
    afr: Annotated[float, typer.Option(help="Annual failure rate per GPU (F3).")] = 0.04,
    spares: Annotated[int, typer.Option(help="Hot spare nodes per GPU type (F2).")] = 0,
    degraded_afr: Annotated[
        float,
        typer.Option(
            "--degraded-afr",
            help="Degraded-node episodes (a slow NIC: multi-node jobs on it crawl) per node "
            "and year; 0, the default, injects none.",
        ),
    ] = 0.0,
    degraded_slowdown: Annotated[
        float,
        typer.Option(help="How many times slower a gang runs on a degraded node."),
    ] = 2.0,
    straggler_watch: Annotated[
        bool,
        typer.Option(
            help="Catch degraded nodes by their ranks' step times (--no-straggler-watch: "
            "they are found only when repaired)."
        ),
    ] = True,
    straggler_factor: Annotated[
        float, typer.Option(help="A node this many times slower than the gang is a straggler.")
    ] = 1.5,
    straggler_window: Annotated[
        float, typer.Option(help="Seconds a node must stay that slow to be caught.")
    ] = 300.0,
    breakers: Annotated[
        str, typer.Option(help="Circuit breakers (F5): stop, flag or off.")
    ] = "stop",
    teams_file: Annotated[
        Path | None,
        typer.Option("--teams", help="Teams YAML: weight, quota and budget per team."),
    ] = None,
    budget: Annotated[
        float | None,
        typer.Option(help="Credits per budget period for every team without a budget."),
    ] = None,
    budget_period_days: Annotated[
        float, typer.Option(help="Length of a budget period, in days.")
    ] = 30.0,
    out: Annotated[
        Path | None,
        typer.Option(help="Write kpis.json, ledger.jsonl and usage.json to this directory."),
    ] = None,
) -> None:
    """Simulate a workload on a cluster under a policy (event-driven, virtual clock)."""
    chosen = chosen_policy(policy, gavel_reset)
    engine = engine_config(notice_stop)  # bad input fails before any trace is read
    if not budget_period_days > 0:
        raise InvalidInput(f"--budget-period-days must be > 0, got {budget_period_days}")
    reading = trace_options(strict, limit, tier_field, tier_map, tier_mix, team_field, walltime)
    inputs = load_inputs(cluster, workload, seed, load, trace, fmt, reading, arrival_scale)
    if inputs.stats is not None:
        typer.echo(f"trace: {inputs.stats.summary()}", err=True)
    teams = inputs.teams
    if teams_file is not None:
        teams = load_teams(teams_file, inputs.cluster, inputs.jobs)
    if budget is not None:
        teams = with_budget(teams, budget)
    config = SimConfig(
        engine=engine,
        economy=EconomyConfig(budget=BudgetPolicy(period_s=budget_period_days * 86_400.0)),
        reliability=dataclasses.replace(
            reliability_config(seed, failures, afr, spares, breakers),
            degraded_afr=degraded_afr,
            degraded_slowdown=degraded_slowdown,
            stragglers=StragglerConfig(straggler_factor, straggler_window)
            if straggler_watch
            else None,
        ),
    )
    with progress_on_tty(len(inputs.jobs)) as finished:
        result = run_simulation(inputs.cluster, teams, chosen, inputs.jobs, config, finished)
    if fmt == "arbiter" and trace is not None:  # the cluster's own history: how close?
        real = real_delays(trace, fmt, reading, seed) or ()
        fidelity = replay_fidelity(real, {policy: result})
        result.kpis["queueing_real_vs_replayed"] = fidelity
        q, r = fidelity["real"], fidelity["replayed"][policy]
        typer.echo(
            f"queueing, real vs replayed: mean {q['mean_s']:.1f} s vs {r['mean_s']:.1f} s, "
            f"P99 {q['p99_s']:.1f} s vs {r['p99_s']:.1f} s ({q['jobs']} jobs)",
            err=True,
        )
    if out is not None:
        write_run(result, out)
    if as_json:
        typer.echo(json.dumps(result.kpis, sort_keys=True))
        return
    Console().print(kpi_table(result.kpis))


@contextmanager
def progress_on_tty(jobs: int) -> Iterator[Callable[[], None] | None]:
    """A bar of finished jobs on stderr while a person watches (stderr is a terminal); nothing
    when stderr goes to a file or a pipe."""
    if not sys.stderr.isatty():
        yield None
        return
    columns = (
        TextColumn("simulating"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} jobs finished"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("simulating", total=jobs)
        yield lambda: progress.advance(task)


def write_run(result: SimResult, out: Path) -> None:
    """Keep a run where `arbiter bill --from-sim` finds it."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InvalidInput(f"--out {out}: cannot create the directory ({e.strerror})") from None
    (out / "kpis.json").write_text(json.dumps(result.kpis, sort_keys=True, indent=2) + "\n")
    if result.economy is not None:
        result.economy.write(out)


def reliability_config(
    seed: int, failures: bool, afr: float, spares: int, breakers: str
) -> ReliabilityConfig:
    """The failure model, spares and breakers the options ask for, seeded like the workload."""
    if breakers not in ("stop", "flag", "off"):
        raise InvalidInput(f"--breakers must be stop, flag or off, got {breakers!r}")
    if not afr >= 0:
        raise InvalidInput(f"--afr must be >= 0, got {afr}")
    if seed < 0:
        raise InvalidInput(f"--seed must be >= 0 when failures are injected, got {seed}")
    policy = None if breakers == "off" else BreakerPolicy(Action(breakers))
    return ReliabilityConfig(
        seed=seed, failures=failures, gpu_afr=afr, spares_per_type=spares, breakers=policy
    )


def kpi_table(kpis: dict) -> Table:
    table = Table(title=f"{kpis['policy']} on {kpis['cluster']} ({kpis['gpus']} GPUs)")
    table.add_column("KPI")
    table.add_column("value", justify="right")
    rows = [
        ("jobs completed", f"{kpis['completed']} / {kpis['jobs']}"),
        ("mean JCT", show_duration(kpis["avg_jct_s"])),
        (
            "P50 / P99 JCT",
            f"{show_duration(kpis['p50_jct_s'])} / {show_duration(kpis['p99_jct_s'])}",
        ),
        *(
            (f"P99 queueing, tier {t}", show_duration(v))
            for t, v in sorted(kpis["p99_queue_delay_s_by_tier"].items())
        ),
        ("utilisation", f"{kpis['utilization']:.1%}"),
        ("goodput", f"{kpis['goodput']:.1%}"),
        ("failures / MTTR", f"{kpis['failures']} / {show_duration(kpis['mttr_s'])}"),
        ("lost GPU-hours", f"{kpis['lost_gpu_hours']:.1f}"),
        ("breaker trips", str(kpis["breaker_trips"])),
        *(
            (
                (
                    "degraded nodes / caught",
                    f"{kpis['degraded_nodes']} / {kpis['stragglers_caught']}",
                ),
                ("GPU-hours slowed by stragglers", f"{kpis['straggler_slow_gpu_hours']:.1f}"),
            )
            if "degraded_nodes" in kpis
            else ()
        ),
        ("preemptions", str(kpis["preemptions"])),
        ("tier-1 preempted", str(kpis["tier1_preempted"])),
        ("fragmentation", f"{kpis['fragmentation']:.1%}"),
        ("SLA attainment", f"{kpis['sla_attainment']:.1%}"),
        ("simulated in", f"{kpis['sim_wall_s']:.2f} s"),
    ]
    for k, v in rows:
        table.add_row(k, v)
    return table


def chosen_policy(name: str, gavel_reset: float | None) -> Policy:
    """The policy `--policy` names, with `--gavel-reset` for the one it applies to."""
    policy = get_policy(name)
    if gavel_reset is None:
        return policy
    if not isinstance(policy, GavelPolicy):
        raise InvalidInput(f"--gavel-reset applies to --policy gavel only, not {name!r}")
    if not (gavel_reset >= 0 and math.isfinite(gavel_reset)):
        raise InvalidInput(f"--gavel-reset must be a number of seconds >= 0, got {gavel_reset}")
    return GavelPolicy(reset_interval_s=gavel_reset)
