"""The single-host test Slurm, started once per session by scripts/slurm-test-cluster.sh when
Slurm's binaries are installed; the Slurm tests skip, saying why, when it cannot be had."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm-test-cluster.sh"
SLURM_DIR = Path(os.environ.get("SLURM_TEST_DIR", "/tmp/slurmtest"))
SLURM_CONF = str(SLURM_DIR / "etc" / "slurm.conf")


@pytest.fixture(scope="session")
def slurm_conf() -> str:
    """SLURM_CONF of a running test Slurm with nodes node1, node2 (8 fake H100 each)."""
    missing = [
        b for b in ("sinfo", "sbatch", "slurmctld", "slurmd", "munged") if not shutil.which(b)
    ]
    if missing:
        pytest.skip(
            f"Slurm is not installed ({', '.join(missing)} missing): "
            "apt-get install slurm-wlm munge"
        )
    if os.geteuid() != 0:
        pytest.skip("the test Slurm needs root (slurmd, mknod for the fake GPUs)")
    env = {**os.environ, "SLURM_TEST_NODES": "2", "SLURM_TEST_DIR": str(SLURM_DIR)}
    res = subprocess.run(
        [str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    if res.returncode != 0:
        pytest.skip(f"the test Slurm did not come up: {res.stderr.strip()[-500:]}")
    return SLURM_CONF
