"""A seeded live service for the dashboard tests: `arbiter serve` on a temp SQLite file with a
fake-GPU agent, admin-registered nodes in a second rack (one cordoned, one failed), three teams
and jobs that leave a known heat map, queue and spend; plus a small `arbiter bench` folder for
the reports page. Started once per session: a server and a bench take seconds each."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from gpu_arbiter.control.launch import ServerProcess, start_agent
from gpu_arbiter.economy import PriceTable
from tests.control.harness import ADMIN, wait_for

SLEEP = "sleep 600"
# name: (weight, guaranteed H100s, budget per period or None)
TEAMS = {"vision": (3.0, 8, 1000.0), "research": (1.0, 0, None), "interns": (1.0, 0, 0.0)}


@dataclass
class Seeded:
    server: ServerProcess
    admin: httpx.Client
    tokens: dict[str, str]
    reports_dir: Path
    running: dict[str, str] = field(default_factory=dict)  # name -> job id
    pending: dict[str, str] = field(default_factory=dict)
    burn: dict[str, float] = field(default_factory=dict)  # credits per hour by team

    @property
    def url(self) -> str:
        return self.server.url


def _submit(client: httpx.Client, name: str, tier: int, gpus: int) -> str:
    r = client.post(
        "/v1/jobs",
        json={"command": SLEEP, "gpus": gpus, "tier": tier, "name": name},
        headers={"Idempotency-Key": name},
    )
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _state(admin: httpx.Client, job_id: str) -> str:
    return admin.get(f"/v1/jobs/{job_id}").json()["state"]


def _bench(out: Path) -> None:
    cmd = [sys.executable, "-m", "gpu_arbiter.cli", "bench", "--out", str(out)]
    cmd += ["--policies", "fifo,arbiter", "--workload", "synthetic:60", "--cluster", "small"]
    cmd += ["--seeds", "2"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)


def _cancel_everything(admin: httpx.Client, jobs_dir: Path) -> None:
    """Stop the jobs' `sleep 600` processes, which would outlive the server (jobs survive its
    restarts): cancel every active job and wait for the local executor's exit-code file of each
    that ran."""
    active = admin.get("/v1/jobs", params={"state": "active", "limit": 10000}).json()
    for j in active:
        r = admin.post(f"/v1/jobs/{j['id']}/cancel")
        assert r.status_code == 200, r.text
    ran = [j["id"] for j in active if j["state"] == "running"]
    wait_for(lambda: all((jobs_dir / f"{j}.rc").exists() for j in ran), timeout_s=30)


@pytest.fixture(scope="session")
def seeded(tmp_path_factory) -> Iterator[Seeded]:
    root = tmp_path_factory.mktemp("web")
    reports = root / "reports"
    _bench(reports / "small-run")
    server = ServerProcess(
        str(root / "arbiter.db"),
        root / "state",
        ADMIN,
        extra=["--heartbeat-timeout", "3600", "--min-grace", "1", "--reports", str(reports)]
        + ["--allow-root-jobs"],
    )
    server.start()
    admin = server.client()
    agent = start_agent(
        server.url, ADMIN, "gpu-node-1", 8, "H100", rack="rack0", log_path=root / "agent.log"
    )
    try:
        wait_for(lambda: admin.get("/v1/nodes").json())
        node = {"gpu_type": "H100", "gpus": 8, "rack": "rack1"}
        for name in ("n2", "n3", "n4", "n5"):
            r = admin.put(f"/v1/nodes/{name}", json=node)
            assert r.status_code == 200, r.text
        tokens = {}
        for team, (weight, quota, budget) in TEAMS.items():
            body = {"weight": weight, "quota": {"H100": quota}, "budget_per_period": budget}
            assert admin.put(f"/v1/teams/{team}", json=body).status_code == 200
            tokens[team] = admin.post("/v1/tokens", json={"team": team}).json()["token"]
        r = admin.post("/v1/nodes/n4/cordon", json={"reason": "maintenance: PSU swap"})
        assert r.status_code == 200, r.text
        r = admin.post("/v1/nodes/n5/heartbeat", json={"ecc_uncorrectable": 3})
        assert r.status_code == 200, r.text
        wait_for(lambda: admin.get("/v1/nodes").json()[-1]["state"] == "down")
        s = Seeded(server, admin, tokens, reports)
        clients = {t: server.client(tok) for t, tok in tokens.items()}
        # 8 + 5 + 5 GPUs busy on three nodes: 3 + 3 free, split across two nodes.
        for name, team, tier, gpus in (
            ("pretrain", "vision", 1, 8),
            ("explore-a", "research", 3, 5),
            ("explore-b", "research", 3, 5),
        ):
            job_id = _submit(clients[team], name, tier, gpus)
            s.running[name] = job_id
            wait_for(lambda j=job_id: _state(admin, j) == "running")
        for name, team, tier, gpus in (
            ("sweep", "research", 3, 6),  # 6 free in total, at most 3 on one node: gang
            ("big-eval", "vision", 3, 12),  # more than are free: capacity
            ("try-out", "interns", 2, 4),  # out of credits: tier 3 only, then gang
        ):
            s.pending[name] = _submit(clients[team], name, tier, gpus)
        for c in clients.values():
            c.close()

        prices = PriceTable()
        s.burn = {
            "vision": 8 * prices.price("H100", 1, False),  # within quota: on demand
            "research": 10 * prices.price("H100", 3, True),  # tier 3: preemptible
            "interns": 0.0,
        }

        def costs_known() -> bool:  # the loop refreshes burn rates once a second
            teams = admin.get("/ui/api/teams").json()["teams"]
            return {t["team"]: t["burn_rate"] for t in teams} == s.burn

        wait_for(costs_known)
        yield s
        _cancel_everything(admin, root / "state" / "jobs")
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)
        admin.close()
        server.close()
