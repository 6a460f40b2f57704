"""`arbiter bench`: replay one workload under several policies and write a comparison directory.

The workload is read once; each policy replays the same jobs on the same cluster. What lands in
`--out` is described in `gpu_arbiter/sim/report.py` (results.json, report.md, per-policy
records.csv and three PNG plots).

Without `--cluster`, the cluster follows the trace: an Alibaba v2023 trace runs on its real node
list; a Gavel trace runs on the cluster of the `cluster_specs*.json` found beside it or one
folder up (the heterogeneous spec first, as Gavel's own experiments compare on it), else on
`DEFAULT_GAVEL_CLUSTER`; anything else runs on the `small` preset.
"""

from __future__ import annotations

import dataclasses
import json
from functools import partial
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

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
    trace_options,
)
from gpu_arbiter.domain import InvalidInput
from gpu_arbiter.engine.policies import POLICIES
from gpu_arbiter.sim import SimConfig, SimResult, simulate
from gpu_arbiter.sim.faults import ReliabilityConfig
from gpu_arbiter.sim.report import BenchSource, write_bench
from gpu_arbiter.traces.arbiter_history import real_queueing
from gpu_arbiter.traces.base import TraceOptions

DEFAULT_POLICIES = ",".join(POLICIES)
DEFAULT_GAVEL_CLUSTER = "gavel:36:36:36"  # the 108-GPU mix of Gavel's simulated experiments
GAVEL_SPEC_FILES = ("cluster_specs_heterogeneous.json", "cluster_specs.json")


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)


def parse_policies(text: str) -> list[str]:
    """A comma list of known policy names, in the order given, each once."""
    names = list(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    if not names:
        raise InvalidInput("--policies: give at least one policy")
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        raise InvalidInput(
            f"--policies: unknown {', '.join(unknown)}; use some of {', '.join(POLICIES)}"
        )
    return names


def gavel_cluster_beside(trace: Path) -> str | None:
    """The first cluster of a Gavel `cluster_specs*.json` next to the trace or one folder up."""
    for folder in (trace.parent, trace.parent.parent):
        for name in GAVEL_SPEC_FILES:
            path = folder / name
            if not path.is_file():
                continue
            try:
                specs = json.loads(path.read_text())
                first = next(iter(specs.values()))[0]
            except (ValueError, AttributeError, StopIteration, IndexError, TypeError):
                raise InvalidInput(
                    f"{path}: expected {{name: ['v100:p100:k80', ...]}} cluster specs"
                ) from None
            return f"gavel:{first}"
    return None


def real_delays(
    trace: Path | None, fmt: str | None, reading: TraceOptions, seed: int
) -> tuple[float, ...] | None:
    """What the jobs of the cluster's own history really waited; None for any other trace."""
    if trace is None or fmt != "arbiter":
        return None
    options = dataclasses.replace(reading, seed=seed)
    return tuple(w.queue_delay_s for w in real_queueing(trace, options))


def default_cluster(trace: Path | None, fmt: str | None) -> str:
    if trace is not None and fmt == "alibaba-v2023":
        return "alibaba-v2023"
    if trace is not None and fmt == "arbiter":
        return "history"
    if trace is not None and fmt == "gavel":
        return gavel_cluster_beside(trace) or DEFAULT_GAVEL_CLUSTER
    return "small"


def bench(
    out: Annotated[Path, typer.Option(help="Directory to write the comparison into.")],
    policies: Annotated[
        str, typer.Option(help="Comma list of policies to compare, in report order.")
    ] = DEFAULT_POLICIES,
    trace: Annotated[Path | None, typer.Option(help="Replay this trace file.")] = None,
    fmt: Annotated[str | None, typer.Option("--format", help="Format of --trace.")] = None,
    workload: Annotated[
        str, typer.Option(help="synthetic:N — N seeded synthetic jobs (ignored with --trace).")
    ] = "synthetic:1000",
    seed: Annotated[
        int, typer.Option(help="Seed of the workload (and of trace tier/team draws).")
    ] = 0,
    seeds: Annotated[
        int,
        typer.Option(
            help="Replay under this many seeds (--seed, --seed + 1, ...); the report adds each "
            "KPI's mean and range over them. Records and plots are of --seed."
        ),
    ] = 1,
    cluster: Annotated[
        str | None,
        typer.Option(help=CLUSTER_HELP + " Default: follows the trace (see `arbiter bench`)."),
    ] = None,
    load: Annotated[float, typer.Option(help="Offered load of the synthetic workload.")] = 0.9,
    strict: StrictOption = False,
    limit: LimitOption = None,
    tier_field: TierFieldOption = "auto",
    tier_map: TierMapOption = None,
    tier_mix: TierMixOption = TIER_MIX,
    team_field: TeamFieldOption = "auto",
    walltime: WalltimeOption = "round-hour",
    arrival_scale: Annotated[float, typer.Option(help=ARRIVAL_SCALE_HELP)] = 1.0,
    notice_stop: Annotated[float, typer.Option(help=NOTICE_STOP_HELP)] = NOTICE_STOP_S,
) -> None:
    """Compare policies on one workload: results.json, report.md, records and plots in --out."""
    names = parse_policies(policies)
    if seeds < 1:
        raise InvalidInput(f"--seeds must be >= 1, got {seeds}")
    engine = engine_config(notice_stop)
    reading = trace_options(strict, limit, tier_field, tier_map, tier_mix, team_field, walltime)
    read = partial(
        load_inputs,
        cluster or default_cluster(trace, fmt),
        workload,
        load=load,
        trace=trace,
        fmt=fmt,
        reading=reading,
        arrival_scale=arrival_scale,
    )
    inputs = read(seed=seed)
    err = Console(stderr=True)
    if inputs.stats is not None:
        err.print(f"trace: {inputs.stats.summary()}", highlight=False, markup=False)
    runs: dict[int, dict[str, SimResult]] = {}
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} runs"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err) as progress:
        task = progress.add_task("simulating", total=len(names) * seeds)
        for s in range(seed, seed + seeds):
            if s != seed:  # each seed draws its own tiers and teams (and synthetic jobs)
                inputs = read(seed=s)
            # The failure draws follow the seed too, as in `arbiter simulate --seed`.
            config = SimConfig(engine=engine, reliability=ReliabilityConfig(seed=s))
            runs[s] = {}
            for name in names:
                progress.update(task, description=f"simulating {name}, seed {s}")
                runs[s][name] = simulate(inputs.cluster, inputs.teams, name, inputs.jobs, config)
                progress.advance(task)
    results = runs[seed]
    source = BenchSource(
        workload=str(trace) if trace is not None else workload,
        fmt=fmt if trace is not None else None,
        stats=inputs.stats,
        seed=seed,
        options=reading if trace is not None else None,
        arrival_scale=arrival_scale,
        real_queue_delays=real_delays(trace, fmt, reading, seed),
    )
    write_bench(out, source, results, runs)
    typer.echo(f"wrote {out / 'results.json'}, {out / 'report.md'} and plots")
