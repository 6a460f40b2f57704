"""`make demo`: the live control plane on one machine, in about a minute.

Starts `arbiter serve` on SQLite with an agent declaring 8 fake H100s, creates three teams
(vision: tier-1 training, nlp: tier-2 fine-tuning, research: tier-3 experiments), and submits
a mixed workload through the REST API. The research jobs fill the spare GPUs; then vision
submits a tier-1 job that needs them, the scheduler preempts tier-3 jobs (SIGTERM: the SDK saves
a checkpoint), the tier-1 job runs, and the preempted jobs start again and resume from their
checkpoints. Everything the audit log records is printed as it happens, then the queue, the
resume evidence and the bill. The service stays up (its URL and an admin token are printed)
until Ctrl-C, which stops it cleanly. `--no-wait` exits after the workload instead.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from gpu_arbiter.control.launch import ServerProcess, free_port, start_agent

console = Console()
# The demo's teams name no unix user to run their jobs as (a deployment gives each team one:
# docs/deployment.md), so when the demo runs as root it must allow root jobs explicitly.
_ROOT_JOBS = ["--allow-root-jobs"] if os.geteuid() == 0 else []
TEAMS = {  # name: (weight, guaranteed H100s)
    "vision": (3.0, 4),
    "nlp": (2.0, 2),
    "research": (1.0, 0),
}


def train_command(steps: int, step_time: float) -> str:
    return shlex.join(
        [
            sys.executable, "-m", "gpu_arbiter.examples.train_tiny", "--steps", str(steps),
            "--step-time", str(step_time), "--every", "1", "--backend", "auto",
        ]
    )  # fmt: skip


class Demo:
    def __init__(self, workdir: Path, port: int | None) -> None:
        self.workdir = workdir
        self.admin_token = f"demo-admin-{secrets.token_hex(8)}"
        self.server = ServerProcess(
            str(workdir / "arbiter.db"),
            workdir / "state",
            self.admin_token,
            port=port,
            extra=["--min-grace", "10", "--tier2-grace", "60", "--cycle-interval", "0.1"]
            + _ROOT_JOBS,
        )
        self.agent: Any = None
        self.t0 = time.time()
        self.seen_audit = 0
        self.names: dict[str, str] = {}

    def start(self) -> None:
        console.print(f"[bold]Starting the control plane[/] (SQLite at {self.workdir}) ...")
        self.server.start()
        self.admin = self.server.client()
        self.agent = start_agent(
            self.server.url,
            self.admin_token,
            "gpu-node-1",
            8,
            "H100",
            interval_s=2.0,
            log_path=self.workdir / "agent.log",
        )
        deadline = time.monotonic() + 60
        while not self.admin.get("/v1/nodes").json():
            if time.monotonic() > deadline:
                raise SystemExit("the agent did not register within 60 s")
            time.sleep(0.2)
        console.print(f"Service at [bold]{self.server.url}[/]; agent registered 8 fake H100s.")
        self.clients: dict[str, httpx.Client] = {}
        for name, (weight, quota) in TEAMS.items():
            self.admin.put(f"/v1/teams/{name}", json={"weight": weight, "quota": {"H100": quota}})
            token = self.admin.post("/v1/tokens", json={"team": name}).json()["token"]
            self.clients[name] = self.server.client(token)
        console.print(
            "Teams: "
            + ", ".join(f"{n} (weight {w:g}, {q} H100 guaranteed)" for n, (w, q) in TEAMS.items())
            + "; 2 H100 form the shared pool."
        )

    def submit(self, team: str, name: str, tier: int, gpus: int, command: str) -> str:
        r = self.clients[team].post(
            "/v1/jobs",
            json={
                "command": command,
                "gpus": gpus,
                "tier": tier,
                "name": name,
                "checkpoint_interval_s": 60,
            },
            headers={"Idempotency-Key": name},
        )
        r.raise_for_status()
        job = r.json()
        self.names[job["id"]] = name
        return job["id"]

    def show_events(self) -> None:
        for e in self.admin.get("/v1/audit", params={"since": self.seen_audit}).json():
            self.seen_audit = e["id"]
            line = self.describe(e)
            if line:
                console.print(f"[dim]{e['at'] - self.t0:6.1f}s[/] {line}")

    def describe(self, e: dict[str, Any]) -> str | None:
        job = e["subject"]
        label = f"[bold]{job}[/] ({self.names.get(job, '?')})"
        d = e["detail"]
        match e["action"]:
            case "submit":
                return f"submitted {label} by {e['actor']}: tier {d['tier']}, {d['gpus']} GPU(s)"
            case "start":
                where = ", ".join(f"{n}:{g}" for n, g in d["allocation"].items())
                borrowed = " [yellow](borrowed)[/]" if d.get("borrowed") else ""
                return f"[green]started[/] {label} on {where}{borrowed}"
            case "preempt":
                return f"[red]preempted[/] {label}: {d['reason']} (grace {d['grace_s']:g} s)"
            case "requeue":
                return f"requeued {label}: {d['reason']}"
            case "completed":
                return f"[green]completed[/] {label}"
            case "failed" | "cancel":
                return f"{e['action']} {label}: {d.get('reason', '')}"
        return None

    def wait_all(self, ids: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.show_events()
            states = [self.admin.get(f"/v1/jobs/{j}").json()["state"] for j in ids]
            if all(s in ("completed", "failed", "cancelled") for s in states):
                return
            time.sleep(0.5)
        console.print("[yellow]Some jobs are still running; see `arbiter queue`.[/]")

    def wait_progress(self, ids: list[str], step: int, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.show_events()
            jobs = [self.admin.get(f"/v1/jobs/{j}").json() for j in ids]
            if all(j["telemetry"].get("step", 0) >= step for j in jobs):
                return
            time.sleep(0.3)

    def run(self) -> None:
        self.start()
        console.rule("Workload")
        self.t0 = time.time()
        research = [
            self.submit("research", f"explore-{i}", 3, 2, train_command(240, 0.05))
            for i in range(3)
        ]
        finetune = self.submit("nlp", "finetune", 2, 2, train_command(200, 0.05))
        self.wait_progress(research, 40)
        console.print("[bold]All 8 GPUs are busy. vision submits a tier-1 job for 4 GPUs.[/]")
        core = self.submit("vision", "pretrain", 1, 4, train_command(150, 0.05))
        self.wait_all([*research, finetune, core], timeout_s=240)
        self.show_events()
        self.report(research)

    def report(self, research: list[str]) -> None:
        console.rule("What happened")
        for j in research:
            log = self.clients["research"].get(f"/v1/jobs/{j}/log").text
            job = self.admin.get(f"/v1/jobs/{j}").json()
            resumed = re.findall(r"resumed from step (\d+)", log)
            how = (
                f"resumed from its checkpoint at step {resumed[-1]}"
                if resumed
                else "never interrupted"
            )
            console.print(
                f"{j} ({self.names[j]}): {job['state']}, preempted {job['preemptions']}x, {how}"
            )
        table = Table(title="Chargeback so far (live ledger; `arbiter bill --url` for all of it)")
        for col in ("team", "GPU-hours", "spent (credits)", "spent (money)", "burn (credits/h)"):
            table.add_column(col, justify="left" if col == "team" else "right")
        for b in self.admin.get("/v1/bill").json():
            table.add_row(
                b["team"],
                f"{b['gpu_hours_total']:.4f}",
                f"{b['credits_spent']:.4f}",
                f"{b['money_spent']:.4f} {b['currency']}",
                f"{b['burn_rate_credits_per_hour']:.2f}",
            )
        console.print(table)

    def serve_forever(self) -> None:
        console.rule("Arbiter is running")
        console.print(
            f"URL:          [bold]{self.server.url}[/]  (API docs: {self.server.url}/docs)"
        )
        console.print(f"Admin token:  {self.admin_token}")
        console.print(f"Metrics:      {self.server.url}/metrics")
        console.print(
            f"Try:          ARBITER_URL={self.server.url} ARBITER_TOKEN={self.admin_token} "
            "arbiter queue --state all"
        )
        console.print("Press Ctrl-C to stop.")
        try:
            while self.server.proc is not None and self.server.proc.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            pass

    def stop(self) -> None:
        if self.agent is not None and self.agent.poll() is None:
            self.agent.send_signal(signal.SIGTERM)
            self.agent.wait(timeout=30)
        self.server.close()
        console.print("Stopped.")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Arbiter's live demo.")
    p.add_argument("--workdir", type=Path, default=Path("out/demo"))
    p.add_argument("--port", type=int, default=None, help="default: 8080 if free")
    p.add_argument("--no-wait", action="store_true", help="exit after the workload")
    args = p.parse_args(argv)
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    port = args.port or (8080 if _port_free(8080) else free_port())
    demo = Demo(args.workdir.resolve(), port)
    # A terminal closed or a supervisor's stop ends the demo as Ctrl-C does: with its server
    # and agent, not leaving them holding the port.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    try:
        demo.run()
        if not args.no_wait:
            demo.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        # Stopping is under way and bounded (the agent is waited for at most 30 s): a second
        # Ctrl-C or a signal make passes on must not cut it short and leave the agent running.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        demo.stop()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


if __name__ == "__main__":
    main()
