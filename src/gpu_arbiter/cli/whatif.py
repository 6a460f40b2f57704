"""`arbiter whatif`: the cluster's own history replayed as it was and under changes.

Each change gives one column beside "as it was" (the history's cluster, teams, prices and
policy): `--cluster` another cluster, `--policy` another policy, `--prices` another price
table, `--teams` other teams, `--move TEAM:TYPE` a team's jobs onto one GPU type (at the
job's speed there, else the type's), `--add-cloud N:TYPE:PRICE` N rented GPUs of TYPE at PRICE
per GPU-hour. What is compared is described in `gpu_arbiter/sim/whatif.py`.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Annotated

import typer

from gpu_arbiter.cli.inputs import cluster_for, load_teams
from gpu_arbiter.domain import Cluster, InvalidInput, JobSpec
from gpu_arbiter.domain.cluster import GPU_CATALOG, Node, Rack
from gpu_arbiter.economy import PriceTable, TcoConfig
from gpu_arbiter.engine import EngineConfig, get_policy
from gpu_arbiter.sim.whatif import BASELINE, Scenario, replay, write_whatif
from gpu_arbiter.traces.arbiter_history import history_teams, read_header
from gpu_arbiter.traces.registry import read_trace

DEFAULT_TCO = Path(__file__).resolve().parents[1] / "examples" / "tco-h100-1024.yaml"
CLOUD_NODE_GPUS = 8


def register(app: typer.Typer) -> None:
    app.command("whatif")(whatif)


def whatif(
    history: Annotated[Path, typer.Option(help="An `arbiter history export` file.")],
    out: Annotated[Path, typer.Option(help="Directory for results.json, report.md, plot.")],
    cluster: Annotated[
        str | None, typer.Option(help="Replay on this cluster too (preset or YAML file).")
    ] = None,
    policy: Annotated[str | None, typer.Option(help="Replay under this policy too.")] = None,
    prices: Annotated[
        Path | None, typer.Option(help="Replay under this price table (YAML) too.")
    ] = None,
    teams: Annotated[
        Path | None, typer.Option(help="Replay with these teams (teams YAML) too.")
    ] = None,
    move: Annotated[
        list[str] | None,
        typer.Option(help="TEAM:TYPE - that team's jobs run on TYPE only (repeatable)."),
    ] = None,
    add_cloud: Annotated[
        list[str] | None,
        typer.Option(help="N:TYPE:PRICE - rent N GPUs of TYPE at PRICE per GPU-hour (repeatable)."),
    ] = None,
    tco: Annotated[
        Path, typer.Option(help="TCO YAML for the cost per GPU-hour (as `arbiter tco`).")
    ] = DEFAULT_TCO,
) -> None:
    """Replay the cluster's own history as it was and under each change, side by side."""
    header = read_header(history)
    tco_config = TcoConfig.from_yaml(tco)
    base_policy = header.get("policy") or "arbiter"
    specs, stats = read_trace(history, "arbiter")
    jobs = list(specs)
    if not jobs:
        raise InvalidInput(f"--history {history}: no job to replay ({stats.summary()})")
    base_cluster = cluster_for("history", history)
    base_prices = (
        PriceTable() if header.get("prices") is None else PriceTable.from_dict(header["prices"])
    )
    base = Scenario(
        BASELINE,
        base_cluster,
        history_teams(history, base_cluster),
        base_policy,
        jobs,
        base_prices,
    )
    changes: list[Scenario] = []
    if cluster is not None:
        topo = cluster_for(cluster)
        changes.append(
            dataclasses.replace(
                base, name=f"cluster {cluster}", cluster=topo, teams=history_teams(history, topo)
            )
        )
    if policy is not None:
        get_policy(policy)
        changes.append(dataclasses.replace(base, name=f"policy {policy}", policy=policy))
    if prices is not None:
        changes.append(
            dataclasses.replace(
                base, name=f"prices {prices.name}", prices=PriceTable.from_yaml(prices)
            )
        )
    if teams is not None:
        changes.append(
            dataclasses.replace(
                base, name=f"teams {teams.name}", teams=load_teams(teams, base_cluster, jobs)
            )
        )
    for text in move or []:
        changes.append(moved(base, text))
    for text in add_cloud or []:
        changes.append(with_cloud(base, text))
    names = [base.name] + [c.name for c in changes]
    if len(set(names)) != len(names):
        raise InvalidInput("the same change is given twice")
    engine = EngineConfig(restart_overhead_s=0.0)  # as the live service runs
    columns = {s.name: replay(s, tco_config, engine) for s in (base, *changes)}
    notes = [
        f"history: {stats.summary()}",
        f"as it was: the history's cluster, teams, prices and policy ({base_policy})",
        f"TCO figures: {tco} with each column's GPUs, utilisation and goodput",
    ]
    write_whatif(out, str(history), columns, notes)
    typer.echo(f"wrote {out / 'results.json'}, {out / 'report.md'} and a plot")


def moved(base: Scenario, text: str) -> Scenario:
    """`TEAM:TYPE`: the team's jobs accept only TYPE, at their own speed there, else TYPE's."""
    team, sep, gpu_type = (p.strip() for p in text.partition(":"))
    if not sep or not team or not gpu_type:
        raise InvalidInput(f"--move {text!r}: expected TEAM:TYPE")
    if gpu_type not in base.cluster.gpus_by_type():
        have = ", ".join(sorted(base.cluster.gpus_by_type()))
        raise InvalidInput(f"--move {text!r}: the cluster has no {gpu_type} (it has {have})")
    if not any(j.team == team for j in base.jobs):
        raise InvalidInput(f"--move {text!r}: the history has no job of team {team!r}")
    speed = base.cluster.gpu_types[gpu_type].speed

    def move(job: JobSpec) -> JobSpec:
        if job.team != team:
            return job
        return dataclasses.replace(job, gpu_types={gpu_type: job.gpu_types.get(gpu_type, speed)})

    return dataclasses.replace(
        base, name=f"move {team}:{gpu_type}", jobs=[move(j) for j in base.jobs]
    )


def with_cloud(base: Scenario, text: str) -> Scenario:
    """`N:TYPE:PRICE`: N more GPUs of TYPE in a rack of their own, rented at PRICE/GPU-hour."""
    parts = [p.strip() for p in text.split(":")]
    try:
        count, gpu_type, price = int(parts[0]), parts[1], float(parts[2])
        if len(parts) != 3:
            raise ValueError
    except (ValueError, IndexError):
        raise InvalidInput(
            f"--add-cloud {text!r}: expected N:TYPE:PRICE, e.g. 256:H100:2.5"
        ) from None
    if count < 1 or not (price >= 0 and math.isfinite(price)):
        raise InvalidInput(f"--add-cloud {text!r}: N must be >= 1 and PRICE >= 0")
    types = dict(base.cluster.gpu_types)
    if gpu_type not in types and gpu_type not in GPU_CATALOG:
        raise InvalidInput(f"--add-cloud {text!r}: unknown GPU type {gpu_type}")
    nodes = [
        Node(f"cloud-{k:04d}", gpu_type, min(CLOUD_NODE_GPUS, count - k * CLOUD_NODE_GPUS), "cloud")
        for k in range(math.ceil(count / CLOUD_NODE_GPUS))
    ]
    topo = Cluster.build(
        f"{base.cluster.name}+{count} cloud {gpu_type}",
        [*base.cluster.nodes, *nodes],
        [*base.cluster.racks.values(), Rack("cloud", pod="cloud")],
        types.values(),
    )
    return dataclasses.replace(
        base,
        name=f"add-cloud {text}",
        cluster=topo,
        cloud_gpus=count,
        cloud_price=price,
    )
