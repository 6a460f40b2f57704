"""The admin's commands over the REST API: `arbiter teams`, `tokens`, `prices`, `nodes`.

Like `sacctmgr` and `scontrol`, each is a group of verbs (`teams create|set|delete|list`);
the group alone lists. Every verb takes `--json` and prints what the server answered, so a
script can chain them: `export ARBITER_TOKEN=$(arbiter tokens create --team vision)`.
Changes need an admin token; the server checks every value and refuses a bad one with a line
naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from gpu_arbiter.cli.client import DEFAULT_URL, Json, Token, Url, _age, api, console
from gpu_arbiter.domain.errors import InvalidInput

# What `PUT /v1/teams/NAME` takes; `teams set` sends back those the server shows for the team
# so that a change of one leaves the others as they were.
TEAM_FIELDS = ("weight", "quota", "budget_per_period", "breaker_policy", "webhook_url", "run_as")


def register(app: typer.Typer) -> None:
    for name, group, commands, default in (
        ("teams", "Teams: weight, quota per GPU type, budget.", TEAMS, list_teams),
        ("tokens", "API tokens for teams, node agents and admins.", TOKENS, list_tokens),
        ("prices", "The price table: credits per GPU-hour.", PRICES, show_prices),
        ("nodes", "Nodes and their GPUs (like sinfo); cordon and uncordon.", NODES, list_nodes),
    ):
        sub = typer.Typer(help=group, invoke_without_command=True)
        for verb, fn in commands.items():
            sub.command(verb)(fn)
        sub.callback()(_lists_without_a_verb(default))
        app.add_typer(sub, name=name)


def _lists_without_a_verb(default: Any) -> Any:
    """The group's callback: alone (`arbiter teams`), it runs its listing with its options."""

    def callback(
        ctx: typer.Context, url: Url = DEFAULT_URL, token: Token = "", as_json: Json = False
    ) -> None:
        if ctx.invoked_subcommand is None:
            default(url=url, token=token, as_json=as_json)

    callback.__doc__ = default.__doc__
    return callback


def _print(data: Any, as_json: bool, table: Table | None = None, line: str = "") -> None:
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    elif table is not None:
        console().print(table)
    else:
        typer.echo(line)


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    return table


def _pairs(items: list[str], option: str, kind: type = int) -> dict[str, Any]:
    """`H100=16` pairs into a mapping; a malformed one is a one-line error naming it."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not (sep and key):
                raise ValueError
            out[key] = kind(value)
        except ValueError:
            raise InvalidInput(
                f"{option} {item!r}: expected NAME=VALUE with a {kind.__name__} value"
            ) from None
    return out


def _optional_number(text: str | None, option: str) -> tuple[bool, float | None]:
    """(given, value) of an option that takes a number or `none` (which clears it)."""
    if text is None:
        return False, None
    if text.lower() == "none":
        return True, None
    try:
        return True, float(text)
    except ValueError:
        raise InvalidInput(f"{option} {text!r}: expected a number or none") from None


def _fmt(d: dict[str, Any]) -> str:
    return ", ".join(f"{k}:{v}" for k, v in sorted(d.items())) or "-"


# -- teams -----------------------------------------------------------------------------------

Quota = Annotated[
    list[str] | None,
    typer.Option("--quota", help="Guaranteed GPUs of a type, TYPE=N (e.g. H100=16); repeat."),
]
Weight = Annotated[float | None, typer.Option(help="Fair-share weight (default 1).")]
Budget = Annotated[
    str | None,
    typer.Option(help="Credits per budget period, or none for no budget (not metered)."),
]
BreakerPolicy = Annotated[
    str | None,
    typer.Option(
        "--breaker-policy", help="What a tripped circuit breaker does to the team's jobs: stop "
        "or flag (F5)."
    ),
]  # fmt: skip
Webhook = Annotated[
    str | None,
    typer.Option(help="URL told of breaker trips (a Slack incoming webhook), or none."),
]

RunAs = Annotated[
    str | None,
    typer.Option("--run-as", help="Unix user the team's jobs run as (local backend), or none."),
]


def _team_body(
    quota: list[str] | None,
    weight: float | None,
    budget: str | None,
    breaker_policy: str | None,
    webhook: str | None,
    run_as: str | None = None,
) -> dict[str, Any]:
    """The fields given on the command line, as the API names them."""
    body: dict[str, Any] = {}
    if quota:
        body["quota"] = _pairs(quota, "--quota")
    if weight is not None:
        body["weight"] = weight
    given, credits = _optional_number(budget, "--budget")
    if given:
        body["budget_per_period"] = credits
    if breaker_policy is not None:
        body["breaker_policy"] = breaker_policy
    if webhook is not None:
        body["webhook_url"] = None if webhook.lower() == "none" else webhook
    if run_as is not None:
        body["run_as"] = None if run_as.lower() == "none" else run_as
    return body


def _team(url: str, token: str, name: str) -> dict[str, Any] | None:
    return next((t for t in api(url, token, "GET", "/v1/teams") if t["name"] == name), None)


def create_team(
    name: Annotated[str, typer.Argument(help="Team name.")],
    quota: Quota = None,
    weight: Weight = None,
    budget: Budget = None,
    breaker_policy: BreakerPolicy = None,
    webhook: Webhook = None,
    run_as: RunAs = None,
    url: Url = DEFAULT_URL,
    token: Token = "",
    as_json: Json = False,
) -> None:
    """Create a team (admin); an existing one is refused (change it with `teams set`)."""
    if _team(url, token, name) is not None:
        raise InvalidInput(f"team {name!r} already exists (change it with `arbiter teams set`)")
    body = _team_body(quota, weight, budget, breaker_policy, webhook, run_as)
    team = api(url, token, "PUT", f"/v1/teams/{name}", json=body)
    _print(team, as_json, line=f"Created team {name}")


def set_team(
    name: Annotated[str, typer.Argument(help="Team name.")],
    quota: Quota = None,
    weight: Weight = None,
    budget: Budget = None,
    breaker_policy: BreakerPolicy = None,
    webhook: Webhook = None,
    run_as: RunAs = None,
    url: Url = DEFAULT_URL,
    token: Token = "",
    as_json: Json = False,
) -> None:
    """Change a team (admin): only the fields given; `--quota` replaces the whole quota."""
    current = _team(url, token, name)
    if current is None:
        raise InvalidInput(f"team {name!r} does not exist (create it with `arbiter teams create`)")
    body = {k: current[k] for k in TEAM_FIELDS if k in current}
    body.update(_team_body(quota, weight, budget, breaker_policy, webhook, run_as))
    team = api(url, token, "PUT", f"/v1/teams/{name}", json=body)
    _print(team, as_json, line=f"Changed team {name}")


def delete_team(
    name: Annotated[str, typer.Argument(help="Team name.")],
    url: Url = DEFAULT_URL,
    token: Token = "",
    as_json: Json = False,
) -> None:
    """Delete a team with no active jobs (admin); its tokens are revoked, its bills kept."""
    gone = api(url, token, "DELETE", f"/v1/teams/{name}")
    _print(gone, as_json, line=f"Deleted team {name}")


def list_teams(url: Url = DEFAULT_URL, token: Token = "", as_json: Json = False) -> None:
    """Teams: weight, guaranteed quota, GPUs in use, burn rate, spend and budget."""
    rows = api(url, token, "GET", "/v1/teams")
    table = _table(
        f"{len(rows)} team(s)",
        *("TEAM", "WEIGHT", "QUOTA", "IN USE", "BURN (cr/h)", "SPENT (cr)", "BUDGET"),
        *("BREAKERS", "WEBHOOK"),
    )
    for t in rows:
        budget = t["budget_per_period"]
        table.add_row(
            t["name"],
            f"{t['weight']:g}",
            _fmt(t["quota"]),
            _fmt(t["gpus_used"]),
            f"{t['burn_rate']:,.2f}",
            f"{t['credits_spent']:,.2f}",
            "-" if budget is None else f"{budget:,.0f}",
            t.get("breaker_policy") or "-",
            t.get("webhook_url") or "-",
        )
    _print(rows, as_json, table)


TEAMS = {"list": list_teams, "create": create_team, "set": set_team, "delete": delete_team}


# -- tokens ----------------------------------------------------------------------------------


def create_token(
    team: Annotated[str | None, typer.Option(help="A token of this team (its jobs only).")] = None,
    agent: Annotated[
        bool, typer.Option("--agent", help="A node agent's token (registers nodes only).")
    ] = False,
    admin: Annotated[bool, typer.Option("--admin", help="Another admin token.")] = False,
    label: Annotated[str, typer.Option(help="A note to tell tokens apart.")] = "",
    url: Url = DEFAULT_URL,
    token: Token = "",
    as_json: Json = False,
) -> None:
    """Create a token (admin) and print it: alone on stdout, so
    `export ARBITER_TOKEN=$(arbiter tokens create --team vision)` works. It is shown only
    this once; the server keeps its hash."""
    if sum((team is not None, agent, admin)) != 1:
        raise InvalidInput("tokens create: give exactly one of --team NAME, --agent or --admin")
    role = "team" if team is not None else "agent" if agent else "admin"
    body = {"role": role, "team": team, "label": label}
    made = api(url, token, "POST", "/v1/tokens", json=body)
    if as_json:
        typer.echo(json.dumps(made, indent=2))
        return
    owner = f"team {team}" if team is not None else role
    typer.echo(f"arbiter: token #{made['id']} for {owner} (shown only now):", err=True)
    typer.echo(made["token"])


def list_tokens(url: Url = DEFAULT_URL, token: Token = "", as_json: Json = False) -> None:
    """Tokens (admin): id, role, team, label, when made and revoked; never their values."""
    rows = api(url, token, "GET", "/v1/tokens")
    table = _table(f"{len(rows)} token(s)", "ID", "ROLE", "TEAM", "LABEL", "AGE", "REVOKED")
    for t in rows:
        revoked = t["revoked_at"]
        table.add_row(
            str(t["id"]),
            t["role"],
            t["team"] or "-",
            t["label"] or "-",
            _age(t["created_at"]),
            "-" if revoked is None else f"{_age(revoked)} ago",
        )
    _print(rows, as_json, table)


def revoke_tokens(
    token_ids: Annotated[list[int], typer.Argument(help="Token ids (`arbiter tokens list`).")],
    url: Url = DEFAULT_URL,
    token: Token = "",
    as_json: Json = False,
) -> None:
    """Revoke tokens (admin): they stop working at once."""
    done = [api(url, token, "DELETE", f"/v1/tokens/{t}") for t in token_ids]
    _print(done, as_json, line="\n".join(f"Revoked token #{t['id']}" for t in done))


TOKENS = {"list": list_tokens, "create": create_token, "revoke": revoke_tokens}


# -- prices ----------------------------------------------------------------------------------


def show_prices(url: Url = DEFAULT_URL, token: Token = "", as_json: Json = False) -> None:
    """The price table: credits per GPU-hour of an H100 by tier, times each type's
    multiplier, and what a credit is worth."""
    doc = api(url, token, "GET", "/v1/prices")
    table = _table("credits per H100-hour", "TIER", "ON DEMAND", "PREEMPTIBLE")
    for tier in ("1", "2", "3"):
        table.add_row(tier, f"{doc['on_demand'][tier]:g}", f"{doc['preemptible'][tier]:g}")
    if as_json:
        _print(doc, as_json)
        return
    console().print(table)
    multipliers = _fmt({k: f"{v:g}" for k, v in doc["gpu_multipliers"].items()})
    typer.echo(f"multipliers: {multipliers}; other types: {doc['default_multiplier']:g}")
    typer.echo(f"1 credit = {doc['credit_value']:g} {doc['currency']}")


def set_prices(
    file: Annotated[
        Path | None,
        typer.Option("--file", help="A price table YAML: the fields it gives replace these."),
    ] = None,
    multiplier: Annotated[
        list[str] | None,
        typer.Option("--multiplier", help="A GPU type's price relative to an H100, TYPE=X."),
    ] = None,
    on_demand: Annotated[
        list[str] | None,
        typer.Option("--on-demand", help="Credits per H100-hour on demand, TIER=X; repeat."),
    ] = None,
    preemptible: Annotated[
        list[str] | None,
        typer.Option("--preemptible", help="Credits per H100-hour preemptible, TIER=X; repeat."),
    ] = None,
    credit_value: Annotated[
        float | None, typer.Option("--credit-value", help="What one credit is worth.")
    ] = None,
    currency: Annotated[str | None, typer.Option(help="The currency of --credit-value.")] = None,
    url: Url = DEFAULT_URL,
    token: Token = "",
    as_json: Json = False,
) -> None:
    """Change the price table (admin): the fields given, the rest as they are. Charges from
    now on use it; what was charged stays."""
    doc = api(url, token, "GET", "/v1/prices")
    if file is not None:
        from gpu_arbiter.domain.config_files import read_yaml_mapping

        doc.update(read_yaml_mapping(file, "price table"))
    for key, pairs, option in (
        ("gpu_multipliers", multiplier, "--multiplier"),
        ("on_demand", on_demand, "--on-demand"),
        ("preemptible", preemptible, "--preemptible"),
    ):
        if pairs:
            doc[key] = {**doc[key], **_pairs(pairs, option, float)}
    if credit_value is not None:
        doc["credit_value"] = credit_value
    if currency is not None:
        doc["currency"] = currency
    stored = api(url, token, "PUT", "/v1/prices", json=doc)
    _print(stored, as_json, line="Changed the price table")


PRICES = {"show": show_prices, "set": set_prices}


# -- nodes -----------------------------------------------------------------------------------


def list_nodes(url: Url = DEFAULT_URL, token: Token = "", as_json: Json = False) -> None:
    """Nodes and their GPUs (like sinfo): type, GPUs in use, state and why."""
    rows = api(url, token, "GET", "/v1/nodes")
    table = _table(
        f"{len(rows)} node(s)", "NODE", "RACK", "TYPE", "GPUS", "USED", "STATE", "HEARTBEAT"
    )
    table.add_column("REASON")
    for n in rows:
        table.add_row(
            n["name"],
            n["rack"],
            n["gpu_type"],
            str(n["gpus"]),
            str(n["gpus_used"]),
            n["state"],
            f"{_age(n['last_heartbeat'])} ago",
            n["reason"] or "-",
        )
    _print(rows, as_json, table)


def cordon(
    node: Annotated[str, typer.Argument(help="Node name.")],
    reason: Annotated[str, typer.Option(help="Why, shown in `arbiter nodes`.")] = "",
    url: Url = DEFAULT_URL,
    token: Token = "",
    as_json: Json = False,
) -> None:
    """Take a node out of service (admin): its jobs are stopped and requeued, nothing new
    starts on it until `uncordon`."""
    body = {"reason": reason} if reason else None
    row = api(url, token, "POST", f"/v1/nodes/{node}/cordon", json=body)
    _print(row, as_json, line=f"Node {node} is {row['state']}")


def uncordon(
    node: Annotated[str, typer.Argument(help="Node name.")],
    url: Url = DEFAULT_URL,
    token: Token = "",
    as_json: Json = False,
) -> None:
    """Put a cordoned node back into service (admin)."""
    row = api(url, token, "POST", f"/v1/nodes/{node}/uncordon")
    _print(row, as_json, line=f"Node {node} is {row['state']}")


NODES = {"list": list_nodes, "cordon": cordon, "uncordon": uncordon}
