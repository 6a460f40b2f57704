"""The dashboard served by the control plane: the cluster as a heat map of every GPU, the running
jobs with their cost so far, the queue with why each job waits, per-team spend, goodput against
utilisation over time, a page per job (telemetry curves, checkpoints, what happened to it, its
cost), and the `arbiter bench` simulation reports. Server-rendered HTML shells, small vanilla
scripts that poll JSON views, and canvases so that 10,000 GPUs draw in a few milliseconds;
nothing is fetched from outside the service."""

from gpu_arbiter.web.routes import dashboard_router

__all__ = ["dashboard_router"]
