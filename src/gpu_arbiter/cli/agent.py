"""`arbiter agent`: register this node's GPUs with the control plane and keep it informed."""

from __future__ import annotations

import logging
import signal
import socket
import threading
from typing import Annotated

import httpx
import typer

from gpu_arbiter.agent import Agent, discover
from gpu_arbiter.domain import ArbiterError, InvalidInput


def register(app: typer.Typer) -> None:
    app.command("agent")(agent)


def agent(
    url: Annotated[str, typer.Option(envvar="ARBITER_URL", help="Control plane URL.")] = (
        "http://127.0.0.1:8080"
    ),
    token: Annotated[
        str, typer.Option(envvar="ARBITER_TOKEN", help="An agent (or admin) token.")
    ] = "",
    name: Annotated[str | None, typer.Option(help="Node name (default: host name).")] = None,
    fake_gpus: Annotated[
        int | None, typer.Option("--fake-gpus", help="Declare N fake GPUs instead of NVML.")
    ] = None,
    gpu_type: Annotated[str | None, typer.Option("--gpu-type", help="GPU type, e.g. H100.")] = None,
    rack: Annotated[str, typer.Option(help="Rack (leaf switch) of this node.")] = "rack0",
    interval: Annotated[float, typer.Option(help="Seconds between heartbeats.")] = 5.0,
) -> None:
    """Register the node (NVML, or --fake-gpus N --gpu-type T), then send heartbeats. It needs
    an agent token: `ARBITER_TOKEN=$(arbiter tokens create --agent) arbiter agent ...`."""
    if not token:
        raise InvalidInput("--token (or ARBITER_TOKEN) is required")
    if interval <= 0:
        raise InvalidInput(f"--interval must be > 0, got {interval}")
    logging.basicConfig(level="INFO", format="%(asctime)s agent %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per heartbeat
    inventory = discover(fake_gpus, gpu_type)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        Agent(url, token, name or socket.gethostname(), inventory, rack, interval).run(stop)
    except httpx.HTTPStatusError as e:  # a refusal the agent cannot retry (401, 403, 422)
        try:
            detail = e.response.json().get("detail", e.response.text)
        except ValueError:
            detail = e.response.text
        status = e.response.status_code
        raise ArbiterError(f"the server refused this node: {status}: {detail}") from None
