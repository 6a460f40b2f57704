"""What one running server holds (`Service`): the database, the control loop, the
authenticator, the metrics and the backend, built once by `arbiter serve` and handed to the
API (`api.app.create_api`) and the dashboard."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine

from gpu_arbiter.backends.base import Backend
from gpu_arbiter.backends.local import LocalBackend
from gpu_arbiter.control.auth import Authenticator
from gpu_arbiter.control.config import ServerConfig
from gpu_arbiter.control.loop import ControlLoop
from gpu_arbiter.control.metrics import Metrics
from gpu_arbiter.control.store import open_database


@dataclass(slots=True)
class Service:
    """Everything one running server holds."""

    db: Engine
    loop: ControlLoop
    auth: Authenticator
    metrics: Metrics
    backend: Any  # a Backend with log_path(job_id) and shutdown(), as every executor has


def build_service(
    db_url: str, config: ServerConfig, min_grace_s: float = 5.0, backend: Backend | None = None
) -> Service:
    """The server's parts; `backend` defaults to local processes under STATE_DIR/jobs."""
    db = open_database(db_url)
    metrics = Metrics()
    auth = Authenticator(db, config.max_auth_failures_per_minute)
    if backend is None:
        backend = LocalBackend(
            config.state_dir / "jobs",
            min_grace_s=min_grace_s,
            jobs_root=config.work_root,
            allow_root=config.allow_root_jobs,
        )
    loop = ControlLoop(db, backend, config, auth, metrics)
    return Service(db, loop, auth, metrics, backend)
