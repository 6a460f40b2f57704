"""The Slurm-like client: `arbiter submit`, `queue`, `cancel`, `nodes`, `teams`.

Every command talks to the REST API at `--url` (or ARBITER_URL) with `--token` (or
ARBITER_TOKEN), prints a Rich table, or JSON with `--json` for scripts. An error from the
server is one line on stderr and exit code 2. `--url` may list several servers, comma-separated
(a leader and its standbys): each request goes to the first one that takes the connection.
"""

from __future__ import annotations

import json
import shlex
import time
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from gpu_arbiter.domain import ArbiterError, InvalidInput

Url = Annotated[str, typer.Option("--url", envvar="ARBITER_URL", help="Control plane URL.")]
Token = Annotated[str, typer.Option("--token", envvar="ARBITER_TOKEN", help="API token.")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
DEFAULT_URL = "http://127.0.0.1:8080"


def register(app: typer.Typer) -> None:
    app.command("submit")(submit)
    app.command("queue")(queue)
    app.command("cancel")(cancel)
    app.command("nodes")(nodes)
    app.command("teams")(teams)


def api(
    url: str, token: str, method: str, path: str, headers: dict[str, str] | None = None, **kw: Any
) -> Any:
    """One request; a refusal or an unreachable server becomes an `ArbiterError` line. Of
    several URLs the first that accepts the connection answers: a server that never got the
    request (connection refused or timed out) is skipped, one that got it is never asked twice
    by this function."""
    if not token:
        raise InvalidInput("--token (or ARBITER_TOKEN) is required")
    urls = [u.strip().rstrip("/") for u in url.split(",") if u.strip()]
    r = None
    for base in urls:
        try:
            r = httpx.request(
                method,
                base + path,
                headers={"Authorization": f"Bearer {token}", **(headers or {})},
                timeout=30,
                **kw,
            )
            break
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            error = e
        except httpx.HTTPError as e:
            raise ArbiterError(f"cannot reach {base}: {e}") from None
    if r is None:
        raise ArbiterError(f"cannot reach {url}: {error if urls else 'no URL given'}")
    if r.status_code >= 400:
        try:
            detail = r.json().get("detail", r.text)
        except ValueError:
            detail = r.text
        raise ArbiterError(f"{r.status_code}: {detail}")
    return r.json()


def _env(pairs: list[str]) -> dict[str, str]:
    out = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise InvalidInput(f"--env {p!r}: expected NAME=VALUE")
        out[key] = value
    return out


def _types(items: list[str]) -> dict[str, float] | list[str]:
    """`H100` or `A100=0.87` (a speed relative to an H100)."""
    if all("=" not in t for t in items):
        return items
    out = {}
    for t in items:
        name, _, speed = t.partition("=")
        try:
            out[name] = float(speed) if speed else 1.0
        except ValueError:
            raise InvalidInput(f"--gpu-type {t!r}: speed must be a number") from None
    return out


def submit(
    command: Annotated[list[str], typer.Argument(help="The command (after --).")],
    url: Url = DEFAULT_URL,
    token: Token = "",
    gpus: Annotated[int, typer.Option(help="GPUs.")] = 1,
    tier: Annotated[int, typer.Option(help="1 core, 2 business, 3 exploratory.")] = 3,
    team: Annotated[str | None, typer.Option(help="Team (admin tokens only).")] = None,
    name: Annotated[str, typer.Option(help="A name to show in the queue.")] = "",
    gpu_type: Annotated[
        list[str] | None, typer.Option("--gpu-type", help="Accepted type[=speed]; repeat.")
    ] = None,
    walltime: Annotated[float | None, typer.Option(help="Estimated run time, seconds.")] = None,
    checkpoint_interval: Annotated[
        float | None, typer.Option("--checkpoint-interval", help="Seconds between saves.")
    ] = None,
    min_gpus: Annotated[int | None, typer.Option("--min-gpus")] = None,
    max_gpus: Annotated[int | None, typer.Option("--max-gpus")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="NAME=VALUE; repeat.")] = None,
    key: Annotated[
        str | None, typer.Option("--key", help="Idempotency key: resubmitting is harmless.")
    ] = None,
    as_json: Json = False,
) -> None:
    """Queue a job (like sbatch); prints its id."""
    body: dict[str, Any] = {
        "command": command[0] if len(command) == 1 else shlex.join(command),
        "gpus": gpus,
        "tier": tier,
        "name": name,
        "env": _env(env or []),
    }
    optional = {
        "team": team,
        "walltime_s": walltime,
        "checkpoint_interval_s": checkpoint_interval,
        "min_gpus": min_gpus,
        "max_gpus": max_gpus,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if gpu_type:
        body["gpu_types"] = _types(gpu_type)
    headers = {"Idempotency-Key": key} if key else {}
    job = api(url, token, "POST", "/v1/jobs", json=body, headers=headers)
    if as_json:
        typer.echo(json.dumps(job, indent=2))
    else:
        typer.echo(f"Submitted job {job['id']} (tier {job['tier']}, {job['state']})")


def _age(since: float | None, until: float | None = None) -> str:
    """H:MM:SS from `since` to `until` (now when None)."""
    if since is None:
        return "-"
    s = int(max(0.0, (time.time() if until is None else until) - since))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def queue_row(job: dict[str, Any], why: dict[str, str]) -> list[str]:
    """One line of `arbiter queue`. TIME is how long a pending job has waited since it was
    submitted, a running one has run since it (re)started, a finished one ran until its end.
    REASON for a pending job is why it waits now (`why`, the dashboard's analysis); what the
    row says was the last thing that happened to it, stale once it is queued again."""
    alloc = job["allocation"] or {}
    where = ",".join(f"{n}[{','.join(map(str, g))}]" for n, g in alloc.get("nodes", {}).items())
    state = job["state"]
    if state in ("running", "preempting"):
        time_ = _age(job["started_at"])
    elif state == "pending":
        time_ = _age(job["submitted_at"])
    else:
        time_ = _age(job["started_at"], job["finished_at"])
    reason = why.get(job["id"], job["reason"]) if state == "pending" else job["reason"]
    return [
        job["id"],
        job["name"],
        job["team"],
        str(job["tier"]),
        state,
        str(job["gpus"]),
        where or "-",
        time_,
        reason,
    ]


def _why_pending(url: str, token: str) -> dict[str, str]:
    """Why each pending job waits, worked out by the server's dashboard (`web.reasons`); none
    when it cannot say (an older server)."""
    try:
        view = api(url, token, "GET", "/ui/api/queue", params={"limit": 10_000})
    except ArbiterError:
        return {}
    return {j["id"]: f"{j['reason']}: {j['why']}" for j in view.get("jobs", [])}


def queue(
    url: Url = DEFAULT_URL,
    token: Token = "",
    state: Annotated[
        str, typer.Option(help="active, pending, running, completed, failed, cancelled or all.")
    ] = "active",
    team: Annotated[str | None, typer.Option(help="Only this team (admin).")] = None,
    as_json: Json = False,
) -> None:
    """Jobs (like squeue): active ones by default."""
    params: dict[str, Any] = {}
    if state != "all":
        params["state"] = state
    if team:
        params["team"] = team
    jobs = api(url, token, "GET", "/v1/jobs", params=params)
    if as_json:
        typer.echo(json.dumps(jobs, indent=2))
        return
    why = _why_pending(url, token) if any(j["state"] == "pending" for j in jobs) else {}
    table = Table(title=f"{len(jobs)} job(s)")
    for col in ("JOBID", "NAME", "TEAM", "TIER", "STATE", "GPUS", "NODES", "TIME", "REASON"):
        table.add_column(col)
    for j in jobs:
        table.add_row(*queue_row(j, why))
    Console().print(table)


def cancel(
    job_ids: Annotated[list[str], typer.Argument(help="Job ids.")],
    url: Url = DEFAULT_URL,
    token: Token = "",
    as_json: Json = False,
) -> None:
    """Cancel jobs (like scancel)."""
    done = [api(url, token, "POST", f"/v1/jobs/{j}/cancel") for j in job_ids]
    if as_json:
        typer.echo(json.dumps(done, indent=2))
    else:
        for j in done:
            typer.echo(f"Cancelled job {j['id']}")


def nodes(url: Url = DEFAULT_URL, token: Token = "", as_json: Json = False) -> None:
    """Nodes and their GPUs (like sinfo)."""
    rows = api(url, token, "GET", "/v1/nodes")
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"{len(rows)} node(s)")
    for col in ("NODE", "RACK", "TYPE", "GPUS", "USED", "STATE", "HEARTBEAT", "REASON"):
        table.add_column(col)
    for n in rows:
        table.add_row(
            n["name"],
            n["rack"],
            n["gpu_type"],
            str(n["gpus"]),
            str(n["gpus_used"]),
            n["state"],
            f"{_age(n['last_heartbeat'])} ago",
            n["reason"],
        )
    Console().print(table)


def teams(url: Url = DEFAULT_URL, token: Token = "", as_json: Json = False) -> None:
    """Teams: weight, guaranteed quota, GPUs in use, burn rate and spend."""
    rows = api(url, token, "GET", "/v1/teams")
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"{len(rows)} team(s)")
    for col in ("TEAM", "WEIGHT", "QUOTA", "IN USE", "BURN (cr/h)", "SPENT (cr)", "BUDGET"):
        table.add_column(col)

    def fmt(d: dict[str, int]) -> str:
        return ", ".join(f"{k}:{v}" for k, v in sorted(d.items())) or "-"

    for t in rows:
        budget = t["budget_per_period"]
        table.add_row(
            t["name"],
            f"{t['weight']:g}",
            fmt(t["quota"]),
            fmt(t["gpus_used"]),
            f"{t['burn_rate']:,.2f}",
            f"{t['credits_spent']:,.2f}",
            "-" if budget is None else f"{budget:,.0f}",
        )
    Console().print(table)
