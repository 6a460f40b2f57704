"""The server's settings: what `arbiter serve` (and its TOML file, `cli.serve_config`) sets.

Its own module because every part of the control plane reads them (the loop's pacing, the
engine's notice, the jobs' environment, accrual, hot spares) and none of those should import
the loop to do so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpu_arbiter.reliability import BreakerConfig
from gpu_arbiter.reliability.stragglers import StragglerConfig


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The server's settings. `state_dir` is the server's own (logs, process state, the admin
    token; mode 0700); the jobs work under `work_root`, outside it."""

    state_dir: Path
    public_url: str = "http://127.0.0.1:8080"
    policy: str = "arbiter"
    tier2_grace_s: float = 7200.0
    heartbeat_timeout_s: float = 30.0
    cycle_interval_s: float = 0.2
    hot_spares: int = 0  # per GPU type (F2)
    idle_cycle_s: float = 5.0
    tick_s: float = 0.25
    max_batch: int = 512
    # Running jobs are charged for the seconds they held their GPUs at least this often (E5).
    accrue_s: float = 60.0
    stragglers: StragglerConfig = field(default_factory=StragglerConfig)
    breakers: BreakerConfig = field(default_factory=BreakerConfig)  # every team's thresholds
    public_metrics: bool = False  # per-team series on /metrics without a token
    jobs_root: Path | None = None  # jobs' working directories (default: `work_root`)
    allow_root_jobs: bool = False  # team jobs may run as root (local and Slurm refuse else)
    max_auth_failures_per_minute: int = 30  # per client address, then 429

    @property
    def work_root(self) -> Path:
        """Where each job gets its working directory: `jobs_root`, else `<state_dir>-work`
        beside the state directory (outside it, and one per server)."""
        if self.jobs_root is not None:
            return self.jobs_root
        return self.state_dir.with_name(self.state_dir.name + "-work")
