"""The HTTP app one `arbiter serve` process serves: the REST API (`control.api`) with the
dashboard (`web`) mounted beside it.

It sits above both because the dashboard reads the control plane (its tables, the loop's
engine state) while the control plane knows nothing of the dashboard: composing them here keeps
the import graph of the packages free of cycles (`tests/test_architecture.py`).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI

from gpu_arbiter.control.api.app import create_api
from gpu_arbiter.control.service import Service
from gpu_arbiter.web import dashboard_router


def create_app(service: Service, reports_dir: Path | None = None) -> FastAPI:
    """The REST API plus the dashboard, which shows bench reports from `reports_dir`."""
    app = create_api(service)
    app.include_router(dashboard_router(service.loop, service.db, service.auth, reports_dir))
    return app
