"""`arbiter serve`: the live control plane (REST API + scheduling loop) on one port.

SQLite file by default (`--db arbiter.db`), PostgreSQL with `--db postgresql://user@host/db`.
On a fresh database an admin token is created, written to STATE_DIR/admin.token and printed
once; `--admin-token` (or ARBITER_ADMIN_TOKEN) sets it instead.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Annotated

import typer

from gpu_arbiter.control.api import build_service, create_app
from gpu_arbiter.control.auth import bootstrap_admin
from gpu_arbiter.control.loop import ServerConfig
from gpu_arbiter.domain import InvalidInput


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    db: Annotated[
        str, typer.Option("--db", help="SQLite file, sqlite:///PATH or postgresql://...")
    ] = "arbiter.db",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    state_dir: Annotated[
        Path, typer.Option("--state-dir", help="Job logs, process state and checkpoints.")
    ] = Path("arbiter-state"),
    admin_token: Annotated[
        str | None, typer.Option("--admin-token", envvar="ARBITER_ADMIN_TOKEN", help="Admin token.")
    ] = None,
    policy: Annotated[str, typer.Option(help="Scheduling policy.")] = "arbiter",
    tier2_grace: Annotated[
        float, typer.Option("--tier2-grace", help="Seconds of notice a tier-2 job gets (S1).")
    ] = 7200.0,
    min_grace: Annotated[
        float,
        typer.Option("--min-grace", help="Seconds between SIGTERM and SIGKILL at the least."),
    ] = 5.0,
    heartbeat_timeout: Annotated[
        float, typer.Option("--heartbeat-timeout", help="Seconds of silence before a node is down.")
    ] = 30.0,
    cycle_interval: Annotated[
        float, typer.Option("--cycle-interval", help="Least seconds between scheduling cycles.")
    ] = 0.2,
    public_url: Annotated[
        str | None, typer.Option("--public-url", help="URL jobs use to reach the API.")
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level")] = "warning",
) -> None:
    """Run the control plane: REST API, scheduling loop and local backend."""
    import uvicorn

    for name, value in (("--tier2-grace", tier2_grace), ("--min-grace", min_grace)):
        if value < 0:
            raise InvalidInput(f"{name} must be >= 0, got {value}")
    if heartbeat_timeout <= 0 or cycle_interval < 0:
        raise InvalidInput("--heartbeat-timeout must be > 0 and --cycle-interval >= 0")
    if not 0 < port < 65536:
        raise InvalidInput(f"--port must be in 1..65535, got {port}")
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    state_dir = state_dir.resolve()
    url = public_url or f"http://{host}:{port}"
    config = ServerConfig(
        state_dir=state_dir,
        public_url=url,
        policy=policy,
        tier2_grace_s=tier2_grace,
        heartbeat_timeout_s=heartbeat_timeout,
        cycle_interval_s=cycle_interval,
    )
    service = build_service(db, config, min_grace_s=min_grace)
    token_file = state_dir / "admin.token"
    created = bootstrap_admin(service.db, admin_token, token_file, time.time())
    if created:
        typer.echo(f"arbiter: admin token (also in {token_file}): {created}", err=True)
    typer.echo(f"arbiter: serving on {url} (db {db}, pid {os.getpid()})", err=True)
    uvicorn.run(create_app(service), host=host, port=port, log_level=log_level)
