"""`arbiter bill`: per-team bills from a simulation run directory (E5, E6).

Reads RESULTS_DIR/ledger.jsonl (written by `Ledger.to_jsonl`) and, when present,
RESULTS_DIR/usage.json with the useful GPU-seconds (goodput, F4) of each team::

    {"useful_gpu_seconds": {"vision": 1234567.0, "nlp": 89012.5},
     "burn_rate_credits_per_hour": {"vision": 28.0}}

Teams missing from usage.json fall back to the useful GPU-seconds recorded on their charges.
The optional burn rates are what each team's jobs still running at the end of the run cost per
hour (E5); a team missing there burns nothing.
Money uses the default price table's credit value unless `--prices FILE` gives another.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Annotated

import typer

from gpu_arbiter.cli.client import DEFAULT_URL, api, console
from gpu_arbiter.domain import InvalidInput
from gpu_arbiter.economy.ledger import Ledger
from gpu_arbiter.economy.prices import PriceTable
from gpu_arbiter.economy.report import TeamBill, render_bills, team_bills


def register(app: typer.Typer) -> None:
    app.command("bill")(bill)


def bill(
    from_sim: Annotated[
        Path | None,
        typer.Option("--from-sim", help="Simulation results directory with ledger.jsonl."),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            help="The live control plane (default: ARBITER_URL, else http://127.0.0.1:8080).",
        ),
    ] = None,
    token: Annotated[str, typer.Option("--token", envvar="ARBITER_TOKEN")] = "",
    prices: Annotated[
        Path | None, typer.Option("--prices", help="Price table YAML (for credit value).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Print what each team used and paid, in credits and in money: live, from the control
    plane's ledger, or of a simulation run (--from-sim DIR)."""
    if from_sim is not None and url is not None:
        raise InvalidInput("bill: give --from-sim DIR or --url URL, not both")
    if from_sim is None and url is None:
        url = os.environ.get("ARBITER_URL") or DEFAULT_URL
    if url is not None:
        live = api(url, token, "GET", "/v1/bill")
        if as_json:
            typer.echo(json.dumps(live, indent=2))
        else:
            bills = [bill_from_dict(b) for b in live]
            console().print(render_bills(bills, title=f"Live: {url}"))
        return
    assert from_sim is not None
    ledger_path = from_sim / "ledger.jsonl"
    if not ledger_path.is_file():
        raise InvalidInput(f"bill: {ledger_path} not found (is {from_sim} a simulation run?)")
    ledger = Ledger.from_jsonl(ledger_path)
    table = PriceTable.from_yaml(prices) if prices else PriceTable()
    useful, burn = read_usage(from_sim / "usage.json")
    bills = team_bills(ledger, prices=table, burn_rates=burn, useful_gpu_seconds=useful)
    if as_json:
        typer.echo(json.dumps([b.to_dict() for b in bills], indent=2))
    else:
        console().print(render_bills(bills, title=f"Chargeback: {from_sim}"))


def read_usage(path: Path) -> tuple[dict[str, float], dict[str, float]]:
    """Useful GPU-seconds and burn rates per team from usage.json; an absent file (or absent
    burn rates) means none given."""
    if not path.is_file():
        return {}, {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InvalidInput(f"usage file {path}: not readable JSON ({e})") from None
    if not isinstance(data, dict):
        data = {}
    useful = _per_team(path, data, "useful_gpu_seconds", "seconds")
    burn_key = "burn_rate_credits_per_hour"
    burn = _per_team(path, data, burn_key, "credits per hour") if burn_key in data else {}
    return useful, burn


def _per_team(path: Path, data: dict, key: str, unit: str) -> dict[str, float]:
    """`data[key]` as a mapping team -> non-negative number, or an `InvalidInput` naming it."""
    values = data.get(key)
    if not isinstance(values, dict):
        raise InvalidInput(f"usage file {path}: {key} must be a mapping team -> {unit}")
    out: dict[str, float] = {}
    for team, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidInput(f"usage file {path}: {key}.{team} must be a number")
        if not (math.isfinite(value) and value >= 0):
            raise InvalidInput(f"usage file {path}: {key}.{team} must be >= 0")
        out[team] = float(value)
    return out


def bill_from_dict(d: dict) -> TeamBill:
    """A bill as the API sends it (`TeamBill.to_dict`) back into a `TeamBill`."""
    spent = d["credits_spent"]
    money = d["money_spent"]
    remaining = d["remaining_credits"]
    return TeamBill(
        team=d["team"],
        gpu_hours={(g["gpu_type"], g["tier"]): g["gpu_hours"] for g in d["gpu_hours"]},
        credits_charged=d["credits_charged"],
        credits_refunded=d["credits_refunded"],
        rerun_credits=d["rerun_credits"],
        credits_granted=d["credits_granted"],
        remaining_credits=math.inf if remaining is None else remaining,
        useful_gpu_hours=d["useful_gpu_hours"],
        burn_rate=d["burn_rate_credits_per_hour"],
        credit_value=money / spent if spent else 1.0,
        currency=d["currency"],
    )
