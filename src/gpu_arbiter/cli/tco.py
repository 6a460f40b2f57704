"""`arbiter tco`: build vs rent for a cluster described in a YAML file (E7)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from gpu_arbiter.economy.tco import TcoConfig, evaluate, render_tco


def register(app: typer.Typer) -> None:
    app.command("tco")(tco)


def tco(
    config: Annotated[
        Path, typer.Option("--config", help="TCO YAML file (see examples/tco-h100-1024.yaml).")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Compare building a GPU cluster with renting one, per GPU-hour and per useful GPU-hour."""
    result = evaluate(TcoConfig.from_yaml(config))
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        Console().print(render_tco(result))
