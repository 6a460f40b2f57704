"""API benchmark: job submissions per second and their latency on loopback, SQLite vs PostgreSQL.

    python -m bench.api_bench [--jobs 3000] [--concurrency 32] [--repeat 3] [--client raw|httpx]
                              [--postgres postgresql://...]

Each run gets a fresh real server (`arbiter serve` in its own process, one 8-GPU node, one
team) on a fresh database. Clients keep `--concurrency` submissions in flight, one keep-alive
connection each; every answer is a committed job (the API acknowledges after the commit, fsync
included). Reported: submissions/s over the whole burst, p50/p99/max latency per request, and
the server's CPU time per submission; the median of `--repeat` runs with the range of all.
PostgreSQL runs when `--postgres` or ARBITER_BENCH_POSTGRES_URL (or ARBITER_TEST_POSTGRES_URL)
names a server, on a database created for each run. Goal on 2 cores: >= 500 submits/s and
p99 < 50 ms. Writes bench/results/api_bench.json and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

from gpu_arbiter.control.launch import ServerProcess

ADMIN = "bench-admin-token"
GOAL_RATE, GOAL_P99_MS = 500.0, 50.0


class _Conn:
    """One keep-alive HTTP/1.1 connection that sends a request and reads the whole answer.

    A bare asyncio client, so that on a 2-core machine the benchmark measures the server and
    not its client: httpx spends several milliseconds of CPU per request, more than the server,
    and both share the same two cores (`--client httpx` measures with it for comparison)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, url: str) -> _Conn:
        u = httpx.URL(url)
        reader, writer = await asyncio.open_connection(u.host, u.port or 80)
        return cls(reader, writer)

    async def post(self, head: bytes, body: bytes) -> tuple[int, bytes]:
        self.writer.write(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        lines = (await self.reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length, chunked = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if not chunked:
            return status, await self.reader.readexactly(length)
        parts = []
        while size := int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16):
            parts.append(await self.reader.readexactly(size + 2))
        await self.reader.readuntil(b"\r\n")
        return status, b"".join(p[:-2] for p in parts)

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def _job(n: int) -> dict[str, Any]:
    return {"command": "sleep 3600", "gpus": 1 + n % 8, "tier": 1 + n % 3}


async def burst(
    url: str,
    token: str,
    jobs: int,
    concurrency: int,
    tag: str = "run",
    client: str = "raw",
    rate: float | None = None,
) -> dict[str, Any]:
    """`jobs` submissions over `concurrency` keep-alive connections. Closed loop (no `rate`):
    each connection sends its next request as soon as the last is answered, so this measures
    the most the server takes and the latency at that saturation. Open loop (`rate`): request
    n is due at n / rate seconds and its latency counts from then, waiting for a free
    connection included, so a stall is not hidden by sending less (coordinated omission).
    Every answer must be 201 with the job (a committed one: the API answers after the commit)."""
    if client == "httpx":
        if rate is not None:
            raise ValueError("--rate needs the raw client")
        return await _burst_httpx(url, token, jobs, concurrency, tag)
    latencies: list[float] = []
    errors = 0
    host = httpx.URL(url).netloc.decode()
    conns = [await _Conn.open(url) for _ in range(concurrency)]
    free: asyncio.Queue[_Conn] = asyncio.Queue()
    for c in conns:
        free.put_nowait(c)

    async def submit(n: int, due: float | None) -> None:
        nonlocal errors
        head = (
            f"POST /v1/jobs HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
            f"Idempotency-Key: {tag}-{n}\r\nContent-Type: application/json\r\n"
        ).encode()
        body = json.dumps(_job(n)).encode()
        conn = await free.get()
        t0 = time.perf_counter() if due is None else due
        try:
            status, answer = await conn.post(head, body)
        finally:
            free.put_nowait(conn)
        latencies.append(time.perf_counter() - t0)
        if status != 201 or "id" not in json.loads(answer):
            errors += 1

    async def closed_loop() -> None:
        counter = iter(range(jobs))

        async def worker() -> None:
            for n in counter:
                await submit(n, None)

        await asyncio.gather(*(worker() for _ in conns))

    async def open_loop(rate: float) -> None:
        tasks = []
        for n in range(jobs):
            due = start + n / rate
            if (wait := due - time.perf_counter()) > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(submit(n, due)))
        await asyncio.gather(*tasks)

    start = time.perf_counter()
    try:
        await (closed_loop() if rate is None else open_loop(rate))
        wall = time.perf_counter() - start
    finally:
        for c in conns:
            await c.close()
    out = _summary(jobs, concurrency, errors, wall, latencies, client)
    return {"mode": "closed" if rate is None else f"{rate:g}/s", **out}


async def _burst_httpx(
    url: str, token: str, jobs: int, concurrency: int, tag: str
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
                t0 = time.perf_counter()
                key = {"Idempotency-Key": f"{tag}-{n}"}
                r = await c.post("/v1/jobs", json=_job(n), headers=key)
                latencies.append(time.perf_counter() - t0)
                if r.status_code != 201:
                    errors += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return _summary(jobs, concurrency, errors, wall, latencies, "httpx")


def _summary(
    jobs: int, concurrency: int, errors: int, wall: float, latencies: list[float], client: str
) -> dict[str, Any]:
    ms = np.array(latencies) * 1000
    return {
        "jobs": jobs,
        "concurrency": concurrency,
        "client": client,
        "errors": errors,
        "wall_s": round(wall, 3),
        "submits_per_s": round(jobs / wall, 1),
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
        "max_ms": round(float(ms.max()), 2),
    }


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc), or NaN elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_one(
    kind: str,
    db: str,
    workdir: Path,
    jobs: int,
    concurrency: int,
    client: str = "raw",
    rate: float | None = None,
) -> list[dict[str, Any]]:
    """One fresh server: a warm-up burst, the closed-loop burst, then (with `rate`) the same
    number of submissions paced at `rate`, on top of the jobs already queued. Besides the rates
    each reports the CPU the server and the client spent per submission: on a shared 2-core
    machine that is steadier than the wall-clock numbers, which move with whatever else runs."""
    server = ServerProcess(
        db, workdir / kind, ADMIN, extra=["--log-level", "warning", "--allow-root-jobs"]
    )
    server.start()
    results = []
    try:
        with server.client() as admin:
            admin.put("/v1/nodes/n1", json={"gpu_type": "H100", "gpus": 8}).raise_for_status()
            admin.put("/v1/teams/bench", json={"quota": {"H100": 4}}).raise_for_status()
            token = admin.post("/v1/tokens", json={"team": "bench"}).json()["token"]
        asyncio.run(burst(server.url, token, min(200, jobs), concurrency, "warm-up", client))
        assert server.proc is not None
        for tag, pace in (("run", None), ("paced", rate)):
            if tag == "paced" and not rate:
                continue
            s0, c0 = _cpu_s(server.proc.pid), time.process_time()
            result = asyncio.run(burst(server.url, token, jobs, concurrency, tag, client, pace))
            s1, c1 = _cpu_s(server.proc.pid), time.process_time()
            result["server_cpu_ms_per_submit"] = round((s1 - s0) / jobs * 1000, 3)
            result["client_cpu_ms_per_submit"] = round((c1 - c0) / jobs * 1000, 3)
            results.append({"database": kind, **result})
    finally:
        server.close()
    return results


def bench_db(
    kind: str, db: Callable[[int], str], workdir: Path, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """`--repeat` runs, each on a fresh server and database. Per mode the median run (by
    submits/s closed, by p99 paced) is the headline and the spread of all runs the noise."""
    runs = [
        r
        for i in range(args.repeat)
        for r in bench_one(
            kind, db(i), workdir / f"{kind}-{i}", args.jobs, args.concurrency, args.client,
            args.rate or None,
        )
    ]  # fmt: skip
    out = []
    for mode in dict.fromkeys(r["mode"] for r in runs):
        same = [r for r in runs if r["mode"] == mode]
        same.sort(key=lambda r: r["submits_per_s"] if mode == "closed" else -r["p99_ms"])
        median = dict(same[len(same) // 2])
        for key in ("submits_per_s", "p50_ms", "p99_ms", "server_cpu_ms_per_submit"):
            median[f"{key}_range"] = [min(r[key] for r in same), max(r[key] for r in same)]
        median["runs"] = same
        out.append(median)
    return out


def goal_met(results: list[dict[str, Any]], database: str) -> bool:
    """The most submits/s (closed loop) reach the goal rate, and the p99 at the goal rate (the
    paced run; the closed loop's where there is none) stays under the goal, without errors."""
    mine = [r for r in results if r["database"] == database]
    closed = next(r for r in mine if r["mode"] == "closed")
    paced = next((r for r in mine if r["mode"] != "closed"), closed)
    errors = sum(run["errors"] for r in mine for run in r["runs"])
    return closed["submits_per_s"] >= GOAL_RATE and paced["p99_ms"] < GOAL_P99_MS and not errors


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
    p.add_argument("--repeat", type=int, default=3, help="fresh-server runs per database")
    p.add_argument(
        "--rate",
        type=float,
        default=GOAL_RATE,
        help="submits/s of the paced (open-loop) run after the closed-loop burst; 0: none",
    )
    p.add_argument(
        "--client",
        choices=("raw", "httpx"),
        default="raw",
        help="raw: a bare asyncio HTTP/1.1 client (default); httpx: the httpx client",
    )
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
        results += bench_db("sqlite", lambda i: str(work / f"bench-{i}.db"), work, args)
        if args.postgres:
            made: list[str] = []

            def pg(_i: int) -> str:
                url, name = postgres_database(args.postgres)
                made.append(name)
                return url

            try:
                results += bench_db("postgres", pg, work, args)
            finally:
                for name in made:
                    drop_postgres(args.postgres, name)
    databases = list(dict.fromkeys(r["database"] for r in results))
    report = {
        "goal": {"submits_per_s": GOAL_RATE, "p99_ms": GOAL_P99_MS},
        "goal_met": {d: goal_met(results, d) for d in databases},
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    # "\\[" keeps Rich from reading "[min-max]" as markup and dropping it.
    table = Table(
        title=f"API submissions on loopback ({os.cpu_count()} CPUs, {args.client} client, "
        f"median of {args.repeat} fresh-server runs, \\[min-max])"
    )
    columns = ("database", "load", "jobs", "in flight", "submits/s", "p50 ms", "p99 ms")
    columns += ("max ms", "server CPU ms/submit", "errors")
    for col in columns:
        table.add_column(col, justify="left" if col in ("database", "load") else "right")

    def spread(r: dict[str, Any], key: str, fmt: str) -> str:
        lo, hi = r[f"{key}_range"]
        return f"{r[key]:{fmt}} [{lo:{fmt}}-{hi:{fmt}}]"

    for r in results:
        load = "closed loop" if r["mode"] == "closed" else f"paced {r['mode']}"
        table.add_row(
            r["database"], load, str(r["jobs"]), str(r["concurrency"]),
            spread(r, "submits_per_s", ".0f"), spread(r, "p50_ms", ".1f"),
            spread(r, "p99_ms", ".1f"), f"{r['max_ms']:.1f}",
            spread(r, "server_cpu_ms_per_submit", ".2f"),
            str(sum(run["errors"] for run in r["runs"])),
        )  # fmt: skip
    verdicts = ", ".join(
        f"{d} {'[green]met[/]' if report['goal_met'][d] else '[red]missed[/]'}" for d in databases
    )
    table.caption = (
        f"goal: >= {GOAL_RATE:g} submits/s closed loop, p99 < {GOAL_P99_MS:g} ms paced at "
        f"{GOAL_RATE:g}/s: {verdicts}"
    )
    if not args.postgres:
        table.caption += "; PostgreSQL skipped: set --postgres or ARBITER_BENCH_POSTGRES_URL"
    Console(width=max(Console().width, 150)).print(table)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
