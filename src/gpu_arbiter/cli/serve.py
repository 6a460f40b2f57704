"""`arbiter serve`: the live control plane (REST API + scheduling loop) on one port.

SQLite file by default (`--db arbiter.db`), PostgreSQL with `--db postgresql://user@host/db`.
On a fresh database an admin token is created, written to STATE_DIR/admin.token and printed
once; `--admin-token` (or ARBITER_ADMIN_TOKEN) sets it instead. `--config FILE` reads every
option from a TOML file (`serve_config`, docs/configuration.md); the command line wins over it.

One serve per state directory and database (`control.lease`): a second one refuses with one
line naming the first, before it touches anything, unless it is started with `--standby`: then
it waits until the first one is gone and takes over (with PostgreSQL, from another host too).

The server's files are private (umask 077; the state directory 0700, the database and token
files 0600, tightened on every start). With the local and Slurm backends each job runs in its
own directory under `--jobs-root`, as its team's `run_as` user; a team job is never run as root
unless `--allow-root-jobs` says so.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from gpu_arbiter.cli import serve_config
from gpu_arbiter.control.auth import Principal, bootstrap_admin
from gpu_arbiter.control.config import ServerConfig
from gpu_arbiter.control.file_modes import make_private
from gpu_arbiter.control.lease import Lease
from gpu_arbiter.control.loop import ControlLoop
from gpu_arbiter.control.schemas import NodeRegister
from gpu_arbiter.control.service import build_service
from gpu_arbiter.control.store import database_url
from gpu_arbiter.domain import InvalidInput
from gpu_arbiter.reliability import BreakerConfig
from gpu_arbiter.reliability.stragglers import StragglerConfig
from gpu_arbiter.server import create_app


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the option was set on the command line or through its environment variable
    (compared by name: typer releases differ in which click their sources come from)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


def _print_config_reference(value: bool) -> None:
    if value:
        typer.echo(serve_config.reference_markdown(), nl=False)
        raise typer.Exit()


def serve(
    ctx: typer.Context,
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
    hot_spares: Annotated[
        int,
        typer.Option("--hot-spares", help="Empty nodes per GPU type held for failed-over jobs."),
    ] = 0,
    cycle_interval: Annotated[
        float, typer.Option("--cycle-interval", help="Least seconds between scheduling cycles.")
    ] = 0.2,
    public_url: Annotated[
        str | None, typer.Option("--public-url", help="URL jobs use to reach the API.")
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level")] = "warning",
    reports: Annotated[
        Path | None,
        typer.Option("--reports", help="Folder of `arbiter bench` results the dashboard shows."),
    ] = None,
    backend: Annotated[
        Literal["local", "slurm", "kubernetes"],
        typer.Option(help="Executor: local processes, Slurm jobs or Kubernetes pods."),
    ] = "local",
    slurm_partition: Annotated[
        str | None, typer.Option("--slurm-partition", help="Slurm partition Arbiter owns.")
    ] = None,
    slurm_config: Annotated[
        Path | None,
        typer.Option(
            "--slurm-config",
            help="TOML file of the teams' Slurm accounts and job shape (docs/deployment.md).",
        ),
    ] = None,
    kubeconfig: Annotated[
        str | None,
        typer.Option(help="kubeconfig file (default: in-cluster config, then ~/.kube/config)."),
    ] = None,
    namespace: Annotated[str, typer.Option(help="Kubernetes namespace for job pods.")] = "arbiter",
    image: Annotated[
        str, typer.Option(help="Container image Kubernetes job pods run the command in.")
    ] = "python:3.11-slim",
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            envvar="ARBITER_CONFIG",
            help="TOML file of these options (docs/configuration.md); the command line wins.",
        ),
    ] = None,
    print_config_reference: Annotated[
        bool,
        typer.Option(
            "--print-config-reference",
            is_eager=True,
            callback=_print_config_reference,
            help="Print the configuration file's reference (Markdown) and exit.",
        ),
    ] = False,
    standby: Annotated[
        bool,
        typer.Option(
            "--standby",
            help="When another serve holds this state dir or database, wait and take over "
            "when it is gone (instead of refusing).",
        ),
    ] = False,
    straggler_factor: Annotated[
        float,
        typer.Option(
            "--straggler-factor",
            help="A node whose ranks are this many times slower than the rest of a gang's "
            "is a straggler.",
        ),
    ] = 1.5,
    straggler_window: Annotated[
        float,
        typer.Option(
            "--straggler-window", help="Seconds a node must stay that slow to be marked degraded."
        ),
    ] = 300.0,
    io_stall_window: Annotated[
        float,
        typer.Option(
            "--io-stall-window",
            help="Seconds a job's I/O wait must stay above 15 % for its I/O-stall breaker to trip.",
        ),
    ] = 600.0,
    jobs_root: Annotated[
        Path | None,
        typer.Option(
            "--jobs-root",
            help="Jobs' working directories, one per job (default: STATE_DIR-work beside it).",
        ),
    ] = None,
    allow_root_jobs: Annotated[
        bool,
        typer.Option(
            "--allow-root-jobs",
            help="Run team jobs as root when the server runs as root and a team has no run_as "
            "user (refused otherwise: a root job can read the server's database and tokens).",
        ),
    ] = False,
    public_metrics: Annotated[
        bool,
        typer.Option(
            "--public-metrics", help="Show per-team series (spend, burn) on /metrics to anyone."
        ),
    ] = False,
    auth_failures_per_minute: Annotated[
        int,
        typer.Option(
            "--auth-failures-per-minute",
            help="Failed authentications one client address may make in a minute before 429.",
        ),
    ] = 30,
) -> None:
    """Run the control plane: REST API, scheduling loop and a local, Slurm or Kubernetes
    backend. With Slurm or Kubernetes the nodes come from the executor's own inventory."""
    import uvicorn

    given = {name for name in ctx.params if _given(ctx, name)}
    opts = serve_config.resolve(config, ctx.params, given)
    # The validated, merged values take the place of the parameters of the same names.
    db, host, port, state_dir = opts.db, opts.host, opts.port, opts.state_dir
    admin_token, policy, public_url, log_level = (
        opts.admin_token, opts.policy, opts.public_url, opts.log_level
    )  # fmt: skip
    tier2_grace, min_grace = opts.tier2_grace, opts.min_grace
    heartbeat_timeout, cycle_interval = opts.heartbeat_timeout, opts.cycle_interval
    hot_spares = opts.hot_spares
    reports, backend, slurm_partition = opts.reports, opts.backend, opts.slurm_partition
    kubeconfig, namespace, image = opts.kubeconfig, opts.namespace, opts.image
    standby = opts.standby
    jobs_root, allow_root_jobs = opts.jobs_root, opts.allow_root_jobs
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    os.umask(0o077)  # everything the server writes is its own; jobs get 022 back
    state_dir = state_dir.resolve()
    url = public_url or f"http://{host}:{port}"
    # Before anything touches the state: the backend adopts jobs and the token file is written.
    make_sqlite_folder(db)
    lease = Lease(state_dir, db, url.split(",")[0])
    with database_errors(db):
        lease.acquire(wait=standby, waiting=lambda m: typer.echo(f"arbiter: {m}", err=True))
    lease.watch(_lost_lease)
    try:  # a busy port fails here, before "serving on"; a standby binds only once it leads
        sock = listen(host, port)
    except InvalidInput:
        lease.release()
        raise
    stragglers = StragglerConfig(opts.straggler_factor, opts.straggler_window)
    config = ServerConfig(
        state_dir=state_dir,
        public_url=url,
        policy=policy,
        tier2_grace_s=tier2_grace,
        heartbeat_timeout_s=heartbeat_timeout,
        cycle_interval_s=cycle_interval,
        hot_spares=hot_spares,
        stragglers=stragglers,
        breakers=BreakerConfig(io_window_s=opts.io_stall_window),
        public_metrics=opts.public_metrics,
        max_auth_failures_per_minute=opts.auth_failures_per_minute,
        jobs_root=jobs_root.resolve() if jobs_root is not None else None,
        allow_root_jobs=allow_root_jobs,
    )
    executor: Any = None
    if backend == "slurm":
        from gpu_arbiter.backends.slurm import SlurmBackend
        from gpu_arbiter.backends.slurm_shape import load

        settings = load(opts.slurm_config) if opts.slurm_config is not None else None
        executor = SlurmBackend(
            state_dir / "jobs",
            partition=slurm_partition,
            settings=settings,
            jobs_root=config.work_root,
            allow_root=allow_root_jobs,
        )
    elif backend == "kubernetes":
        from gpu_arbiter.backends.kubernetes import KubernetesBackend

        executor = KubernetesBackend.connect(
            kubeconfig, namespace, image, state_dir / "jobs", default_grace_s=tier2_grace
        )
    with database_errors(db):
        service = build_service(db, config, min_grace_s=min_grace, backend=executor)
    make_private(state_dir, db)
    if backend in ("local", "slurm") and os.geteuid() == 0 and not allow_root_jobs:
        typer.echo(
            "arbiter: running as root: jobs of teams without a run_as user will be refused "
            "(set one with PUT /v1/teams/NAME, or pass --allow-root-jobs)",
            err=True,
        )
    if executor is not None:
        _sync_nodes(service.loop, executor, heartbeat_timeout / 3)
    token_file = state_dir / "admin.token"
    created = bootstrap_admin(service.db, admin_token, token_file, time.time())
    if created:
        typer.echo(f"arbiter: admin token (also in {token_file}): {created}", err=True)
    typer.echo(f"arbiter: serving on {url} (db {db}, pid {os.getpid()})", err=True)
    app = create_app(service, reports_dir=reports)
    _settle_heap()
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level))
    # `arbiter drain`: once no job runs, shut down as Ctrl-C does, and exit 0.
    service.loop.on_drained = lambda: setattr(server, "should_exit", True)
    try:
        server.run(sockets=[sock])
    finally:
        lease.release()


def _lost_lease(why: str) -> None:
    """A leader that lost its lease stops at once, without a word to its jobs: a standby may
    already schedule them (and adopts them as they run)."""
    typer.echo(f"arbiter: {why}; stopping so that a standby takes over", err=True)
    os._exit(75)


def listen(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound now so that a busy port is one line before the
    server prints "serving on", and held until uvicorn serves on it."""
    sock: socket.socket | None = None
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        sock.bind((host, port))
        sock.listen(2048)
        return sock
    except (OSError, socket.gaierror) as e:
        if sock is not None:
            sock.close()
        raise InvalidInput(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def make_sqlite_folder(db: str) -> None:
    """A SQLite file's folder is made, as a state directory is (`--db sqlite:///out/a.db` on
    a machine without out/)."""
    url = database_url(db)
    if not url.startswith("sqlite"):
        return
    path = url.split("///", 1)[1]
    if path and path != ":memory:":
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InvalidInput(f"--db {db}: cannot create its folder ({e.strerror})") from None


@contextmanager
def database_errors(db: str) -> Iterator[None]:
    """A database that cannot be opened (an unreachable PostgreSQL, a file that cannot be
    written) as one line naming it, its password hidden."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    try:
        yield
    except SQLAlchemyError as e:
        cause = e.orig if getattr(e, "orig", None) is not None else e
        text = str(cause).strip()
        first = text.splitlines()[0] if text else type(cause).__name__
        shown = make_url(db).render_as_string(hide_password=True) if "://" in db else db
        raise InvalidInput(f"--db {shown}: cannot open the database ({first})") from None


def _settle_heap() -> None:
    """Keep full garbage collections off the API's p99.

    Everything loaded so far (the framework, the routes, the schemas: most of the heap) is
    moved out of the collector's reach; a full pass otherwise walked all of it and stalled
    every request in flight for 200-400 ms. What remains is the queue itself, which grows with
    the jobs held (~50 ms per pass at 6000 queued jobs on 2 busy cores), so full passes are
    made rarer too: after 1000 middle-generation passes instead of 10. Cycles among the young
    are still found by the frequent young passes; only long-lived cyclic garbage waits."""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 1000)


def _sync_nodes(loop: ControlLoop, executor: Any, every_s: float) -> None:
    """Register the executor's healthy GPU nodes and keep them alive: on Slurm or Kubernetes
    the executor is the node agent. A faulty node is left out (its heartbeat stops); the
    executor's own NodeDown/NodeUp events move it down and up."""

    def run() -> None:
        while True:
            try:
                register_inventory(loop, executor)
            except Exception:  # a failed listing is retried; the server keeps serving
                logging.getLogger("gpu_arbiter.serve").exception("node inventory failed")
            time.sleep(every_s)

    threading.Thread(target=run, name="arbiter-inventory", daemon=True).start()


def register_inventory(loop: ControlLoop, executor: Any) -> None:
    """One poll of the executor's nodes: each healthy one is registered again, which is its
    heartbeat; a faulty one (down, drained, not responding) is not."""
    agent = Principal("agent", None, 0)
    for n in executor.inventory():
        if not n.faulty:
            req = NodeRegister(gpu_type=n.gpu_type, gpus=n.gpus, rack=n.rack)
            loop.call(loop.commands.register_node, agent, n.name, req).result()
