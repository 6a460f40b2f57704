"""The Slurm-like client for jobs: `arbiter submit`, `queue`, `cancel`, `jobs show`, `logs`.

Every command talks to the REST API at `--url` (or ARBITER_URL) with `--token` (or
ARBITER_TOKEN), prints a Rich table, or JSON with `--json` for scripts. An error from the
server is one line on stderr and exit code 2. `--url` may list several servers, comma-separated
(a leader and its standbys): each request goes to the first one that takes the connection.
This module and `admin` import only httpx, Rich and Typer, so a client command starts fast
(`main.COMMANDS` loads nothing else for them).
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

from gpu_arbiter.domain.errors import ArbiterError, InvalidInput

Url = Annotated[str, typer.Option("--url", envvar="ARBITER_URL", help="Control plane URL.")]
Token = Annotated[str, typer.Option("--token", envvar="ARBITER_TOKEN", help="API token.")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
DEFAULT_URL = "http://127.0.0.1:8080"
TIMES = ("submitted_at", "first_start", "started_at", "finished_at")


def register(app: typer.Typer) -> None:
    app.command("submit")(submit)
    app.command("queue")(queue)
    app.command("cancel")(cancel)
    app.command("logs")(logs)
    jobs = typer.Typer(help="One job in detail (`arbiter queue` lists them).", no_args_is_help=True)
    jobs.command("show")(show_job)
    app.add_typer(jobs, name="jobs")
    app.command("drain")(drain)


def api(
    url: str, token: str, method: str, path: str, headers: dict[str, str] | None = None, **kw: Any
) -> Any:
    """One request; a refusal or an unreachable server becomes an `ArbiterError` line. Of
    several URLs the first that accepts the connection answers: a server that never got the
    request (connection refused or timed out) is skipped, one that got it is never asked twice
    by this function."""
    if not token:
        raise InvalidInput(
            "--token (or ARBITER_TOKEN) is required; `arbiter serve` wrote the admin token to "
            "STATE_DIR/admin.token (arbiter-state/admin.token by default)"
        )
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
        except (httpx.HTTPError, httpx.InvalidURL) as e:
            raise ArbiterError(f"cannot reach {base}: {e}") from None
    if r is None:
        raise ArbiterError(f"cannot reach {url}: {error if urls else 'no URL given'}")
    if r.status_code >= 400:
        try:
            detail = r.json().get("detail", r.text)
        except ValueError:
            detail = r.text
        raise ArbiterError(f"{r.status_code}: {detail}")
    if r.headers.get("content-type", "").startswith("application/json"):
        return r.json()
    return r.text


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
    min_gpus: Annotated[
        int | None,
        typer.Option("--min-gpus", help="Elastic job: the fewest GPUs it runs on (S8)."),
    ] = None,
    max_gpus: Annotated[
        int | None,
        typer.Option("--max-gpus", help="Elastic job: the most GPUs it grows to (S8)."),
    ] = None,
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
    """Why each pending job waits, as the server's engine records it (`engine.waiting`); none
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
    console().print(table)


def cancel(
    job_ids: Annotated[list[str], typer.Argument(help="Job ids.")],
    url: Url = DEFAULT_URL,
    token: Token = "",
    as_json: Json = False,
) -> None:
    """Cancel jobs (like scancel): says which were cancelled and which not (exit 2 if any
    was not)."""
    done, failed = [], []
    for job_id in job_ids:
        try:
            done.append(api(url, token, "POST", f"/v1/jobs/{job_id}/cancel"))
        except ArbiterError as e:
            failed.append((job_id, str(e)))
    if as_json:
        typer.echo(json.dumps(done, indent=2))
    else:
        for j in done:
            typer.echo(f"Cancelled job {j['id']}")
    for job_id, why in failed:
        typer.echo(f"arbiter: error: job {job_id} not cancelled: {why}", err=True)
    if failed:
        raise typer.Exit(2)


def show_job(
    job_id: Annotated[str, typer.Argument(help="Job id.")],
    url: Url = DEFAULT_URL,
    token: Token = "",
    as_json: Json = False,
) -> None:
    """Everything about one job (like scontrol show job): state, why it waits, where it runs,
    its last telemetry."""
    job = api(url, token, "GET", f"/v1/jobs/{job_id}")
    if as_json:
        typer.echo(json.dumps(job, indent=2))
        return
    table = Table(title=f"job {job['id']}", show_header=False)
    table.add_column("field")
    table.add_column("value", overflow="fold")
    for key, value in job.items():
        if key in TIMES and value is not None:
            value = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))
        elif isinstance(value, dict | list):
            value = json.dumps(value) if value else "-"
        elif value is None or value == "":
            value = "-"
        table.add_row(key, str(value))
    console().print(table)


def logs(
    job_id: Annotated[str, typer.Argument(help="Job id.")],
    url: Url = DEFAULT_URL,
    token: Token = "",
    tail: Annotated[int, typer.Option(help="Print at most the last N bytes.", min=1)] = 65536,
    as_json: Json = False,
) -> None:
    """A job's output, stdout and stderr together (the end of it, like `tail -c`)."""
    text = api(url, token, "GET", f"/v1/jobs/{job_id}/log", params={"tail": tail})
    if as_json:
        typer.echo(json.dumps({"id": job_id, "log": text}, indent=2))
    else:
        typer.echo(text, nl=not text or not text.endswith("\n"))


def console() -> Console:
    """Tables at their natural width when piped (Rich would cut them at 80 columns)."""
    import sys

    return Console() if sys.stdout.isatty() else Console(width=1_000)


def drain(
    url: Url = DEFAULT_URL,
    token: Token = "",
    grace: Annotated[
        float | None,
        typer.Option("--grace", help="Longest notice a job gets, seconds (default: its tier's)."),
    ] = None,
    as_json: Json = False,
) -> None:
    """Stop the server for good (admin): every running job gets its notice and is queued
    again, nothing starts, and `arbiter serve` exits once no job runs. (Ctrl-C instead leaves
    jobs running for the next start to adopt.)"""
    if grace is not None and not 0 <= grace <= 1e7:
        raise InvalidInput(f"--grace must be in 0..1e7 seconds, got {grace}")
    body = {"grace_s": grace} if grace is not None else {}
    out = api(url, token, "POST", "/v1/drain", json=body)
    if as_json:
        typer.echo(json.dumps(out, indent=2))
    else:
        n = len(out["stopping"])
        typer.echo(f"Draining: {n} job(s) stopping; the server exits once none runs")
