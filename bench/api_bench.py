"""API benchmark: job submissions per second and their latency on loopback, SQLite vs PostgreSQL.

    python -m bench.api_bench [--jobs 3000] [--concurrency 32] [--postgres postgresql://...]

Each database gets a fresh real server (`arbiter serve` in its own process, one 8-GPU node, one
team). Clients keep `--concurrency` submissions in flight over keep-alive connections; every
answer is a committed job (the API acknowledges after the commit, fsync included). Reported:
submissions/s over the whole burst and p50/p99/max latency per request. PostgreSQL runs when
`--postgres` or ARBITER_BENCH_POSTGRES_URL (or ARBITER_TEST_POSTGRES_URL) names a server, on a
database created for the run. Goal on 2 cores: >= 500 submits/s and p99 < 50 ms.
Writes bench/results/api_bench.json and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

from gpu_arbiter.control.launch import ServerProcess

ADMIN = "bench-admin-token"
GOAL_RATE, GOAL_P99_MS = 500.0, 50.0


async def burst(
    url: str, token: str, jobs: int, concurrency: int, tag: str = "run"
) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    counter = iter(range(jobs))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as c:

        async def worker() -> None:
            nonlocal errors
            for n in counter:
                body = {"command": "sleep 3600", "gpus": 1 + n % 8, "tier": 1 + n % 3}
                t0 = time.perf_counter()
                r = await c.post("/v1/jobs", json=body, headers={"Idempotency-Key": f"{tag}-{n}"})
                latencies.append(time.perf_counter() - t0)
                if r.status_code != 201:
                    errors += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    ms = np.array(latencies) * 1000
    return {
        "jobs": jobs,
        "concurrency": concurrency,
        "errors": errors,
        "wall_s": round(wall, 3),
        "submits_per_s": round(jobs / wall, 1),
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
        "max_ms": round(float(ms.max()), 2),
    }


def bench_one(kind: str, db: str, workdir: Path, jobs: int, concurrency: int) -> dict[str, Any]:
    server = ServerProcess(db, workdir / kind, ADMIN, extra=["--log-level", "warning"])
    server.start()
    try:
        with server.client() as admin:
            admin.put("/v1/nodes/n1", json={"gpu_type": "H100", "gpus": 8}).raise_for_status()
            admin.put("/v1/teams/bench", json={"quota": {"H100": 4}}).raise_for_status()
            token = admin.post("/v1/tokens", json={"team": "bench"}).json()["token"]
        asyncio.run(burst(server.url, token, min(200, jobs), concurrency, "warm-up"))
        result = asyncio.run(burst(server.url, token, jobs, concurrency))
    finally:
        server.stop()
        server.kill()
    return {"database": kind, **result}


def postgres_database(base: str) -> tuple[str, str]:
    import psycopg

    name = f"arbiter_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{base.rpartition('/')[0]}/{name}", name


def drop_postgres(base: str, name: str) -> None:
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Submissions/s and p99 latency of the REST API.")
    p.add_argument("--jobs", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument(
        "--postgres",
        default=os.environ.get("ARBITER_BENCH_POSTGRES_URL")
        or os.environ.get("ARBITER_TEST_POSTGRES_URL"),
    )
    p.add_argument("--out", type=Path, default=Path("bench/results/api_bench.json"))
    args = p.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="arbiter-bench-") as tmp:
        work = Path(tmp)
        results.append(
            bench_one("sqlite", str(work / "bench.db"), work, args.jobs, args.concurrency)
        )
        if args.postgres:
            url, name = postgres_database(args.postgres)
            try:
                results.append(bench_one("postgres", url, work, args.jobs, args.concurrency))
            finally:
                drop_postgres(args.postgres, name)
    report = {
        "goal": {"submits_per_s": GOAL_RATE, "p99_ms": GOAL_P99_MS},
        "cpus": os.cpu_count(),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    table = Table(title=f"API submissions on loopback ({os.cpu_count()} CPUs)")
    for col in (
        "database",
        "jobs",
        "in flight",
        "submits/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "errors",
        "goal",
    ):
        table.add_column(col, justify="left" if col == "database" else "right")
    for r in results:
        ok = r["submits_per_s"] >= GOAL_RATE and r["p99_ms"] < GOAL_P99_MS and not r["errors"]
        table.add_row(
            r["database"], str(r["jobs"]), str(r["concurrency"]), f"{r['submits_per_s']:.0f}",
            f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}", f"{r['max_ms']:.1f}", str(r["errors"]),
            "[green]met[/]" if ok else "[red]missed[/]",
        )  # fmt: skip
    if not args.postgres:
        table.caption = "PostgreSQL skipped: set --postgres or ARBITER_BENCH_POSTGRES_URL"
    Console().print(table)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
