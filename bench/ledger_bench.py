"""Start-up and bill benchmark: what a restart and a bill request cost over a long ledger.

    python -m bench.ledger_bench [--entries 200000] [--running 300]

Writes a SQLite ledger the way the previous release's live accrual did (one "run" charge per
running job per minute: `--entries` of them, spread over jobs long finished, plus ten minutes
of each of `--running` jobs still running), then times the loop's start-up read of its books
(`Accounts.load`, control/books.py) and counts the entries it parsed into Python. Since the
books are read as sums, the time should barely move with `--entries` and the entries parsed
are the running jobs' open charges only. Then times a bill request (`GET /v1/bill`: the
database sums the ledger per team, control/bills.py) over the same ledger, and, over the
smaller ledger, the bill as it was made before (every entry read and re-checked), and the
dashboard's spend of the last 30 days (`/ui/api/teams`), summed by the database against
folded from each entry's JSON as before. Writes
bench/results/ledger_bench.json. Times are wall-clock, with the process's CPU time beside
them (the database is SQLite, in the process): on a shared machine the CPU time is the figure
that does not depend on what else runs.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import tracemalloc
from pathlib import Path

from rich.console import Console
from rich.table import Table
from sqlalchemy import insert, select

from gpu_arbiter.control.accounting import Accounts, ledger_row
from gpu_arbiter.control.bills import read_totals, spend_since
from gpu_arbiter.control.metrics import Metrics
from gpu_arbiter.control.store import JOBS, LEDGER, insert_rows, open_database
from gpu_arbiter.domain import JobSpec
from gpu_arbiter.economy import ChargeModel, Entry, Ledger
from gpu_arbiter.economy.report import TeamBill, bills_from_totals, team_bills
from gpu_arbiter.web.views import period_spend

NOW = 1_800_000_000.0
CHUNK = 50_000
FROM_SCRATCH_AT_MOST = 200_000  # the bill the old way, only where it takes seconds
PERIOD_S = 30 * 86_400.0  # the dashboard's budget period


def _write_ledger(engine, entries: int, running: int) -> None:
    """`entries` minute charges of finished jobs (100 h each), then 10 of each running job."""
    book, model = Ledger(), ChargeModel()
    with engine.begin() as conn:
        for j in range(running):
            conn.execute(
                insert(JOBS).values(
                    id=f"r{j}",
                    seq=j + 1,
                    team=f"t{j % 10}",
                    state="running",
                    tier=1,
                    spec={},
                    submitted_at=NOW - 600,
                    seg_start=NOW - 600,
                    seg_gpu_type="H100",
                    seg_gpus=4,
                    seg_tier=1,
                )
            )

    def minutes(job_id: str, team: str, start: float, n: int) -> None:
        spec = JobSpec(id=job_id, team=team, gpus=4, tier=1)
        for k in range(n):
            a = start + 60 * k
            model.charge_segment(
                book, spec, gpu_type="H100", tier=1, gpus=4, start=a, end=a + 60, preemptible=False
            )
            if len(book.entries()) >= CHUNK:
                _flush(engine, book)

    for k in range(0, entries, 6000):
        minutes(f"old{k}", f"t{k % 10}", NOW - 90 * 86_400 + k * 60, min(6000, entries - k))
    for j in range(running):
        minutes(f"r{j}", f"t{j % 10}", NOW - 600, 10)
    _flush(engine, book)


def _flush(engine, book: Ledger) -> None:
    rows = [ledger_row(e, book) for e in book.entries()]
    if rows:
        with engine.begin() as conn:
            insert_rows(conn, LEDGER, rows)
    book.forget(())


def measure(entries: int, running: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        engine = open_database(str(Path(tmp) / "ledger.db"))
        try:
            _write_ledger(engine, entries, running)
            parsed = 0
            from_json = Entry.from_json.__func__  # type: ignore[attr-defined]

            def counting(cls, data, where="ledger entry"):
                nonlocal parsed
                parsed += 1
                return from_json(cls, data, where)

            Entry.from_json = classmethod(counting)  # type: ignore[method-assign]
            accounts = Accounts(Metrics(), 60.0)
            try:
                t0, c0 = time.perf_counter(), time.process_time()
                with engine.connect() as conn:
                    accounts.load(conn, NOW)
                seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
                tracemalloc.start()  # a second load, traced (tracing slows it down)
                with engine.connect() as conn:
                    Accounts(Metrics(), 60.0).load(conn, NOW)
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
            finally:
                Entry.from_json = classmethod(from_json)  # type: ignore[method-assign]
            t0, c0 = time.perf_counter(), time.process_time()
            bills = _bills(engine)
            bill_seconds, bill_cpu = time.perf_counter() - t0, time.process_time() - c0
            tracemalloc.start()
            _bills(engine)
            bill_peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert len(bills) == 10
            scratch = scratch_cpu = None
            if entries <= FROM_SCRATCH_AT_MOST:
                t0, c0 = time.perf_counter(), time.process_time()
                _bills_from_scratch(engine)
                scratch, scratch_cpu = time.perf_counter() - t0, time.process_time() - c0
            spend = {}
            for how, read in (("spend", _spend), ("spend_parsed", _spend_parsed)):
                t0, c0 = time.perf_counter(), time.process_time()
                spend[how] = read(engine, NOW - PERIOD_S)
                spend[f"{how}_s"] = time.perf_counter() - t0
                spend[f"{how}_cpu_s"] = time.process_time() - c0
            assert spend["spend"].keys() == spend["spend_parsed"].keys()
        finally:
            engine.dispose()
    return {
        "ledger_entries": float(len(accounts.ledger)),
        "running_jobs": float(running),
        "startup_s": seconds,
        "startup_cpu_s": cpu,
        "peak_mib": peak / 2**20,
        "entries_parsed": float(parsed) / 2,  # per load
        "bill_s": bill_seconds,
        "bill_cpu_s": bill_cpu,
        "bill_peak_mib": bill_peak / 2**20,
        "bill_from_scratch_s": scratch,
        "bill_from_scratch_cpu_s": scratch_cpu,
        **{k: v for k, v in spend.items() if k.endswith("_s")},
    }


def _bills_from_scratch(engine) -> list[TeamBill]:
    """The bill as releases before 0006 made it: every entry read and re-checked."""
    with engine.connect() as conn:
        rows = conn.execute(select(LEDGER.c.entry).order_by(LEDGER.c.seq)).all()
    return team_bills(Ledger.from_lines(json.dumps(r.entry) for r in rows))


def _bills(engine) -> list[TeamBill]:
    """What `GET /v1/bill` reads and computes (control/api/economy.py)."""
    with engine.connect() as conn:
        return bills_from_totals(read_totals(conn))


def _spend(engine, since: float) -> dict:
    """What the dashboard's teams panel reads now (web/routes.py)."""
    with engine.connect() as conn:
        return period_spend(spend_since(conn, since))


def _spend_parsed(engine, since: float) -> dict:
    """The same, as it was read before: every entry of the period, JSON and all."""
    with engine.connect() as conn:
        rows = conn.execute(select(LEDGER.c.entry).where(LEDGER.c.at >= since)).all()
    return period_spend(r.entry for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=200_000)
    ap.add_argument("--running", type=int, default=300)
    args = ap.parse_args()
    runs = [measure(n, args.running) for n in (args.entries // 10, args.entries)]
    table = Table(title="start-up over a ledger of minute charges (SQLite, traced memory)")
    for col in (
        "ledger entries",
        "running jobs",
        "start-up s (CPU)",
        "peak MiB",
        "entries parsed",
        "bill s (CPU)",
        "from scratch s (CPU)",
        "bill peak MiB",
        "30-day spend s (CPU)",
        "parsed s (CPU)",
    ):
        table.add_column(col, justify="right")
    for r in runs:
        table.add_row(
            f"{r['ledger_entries']:,.0f}",
            f"{r['running_jobs']:.0f}",
            f"{r['startup_s']:.2f} ({r['startup_cpu_s']:.2f})",
            f"{r['peak_mib']:.1f}",
            f"{r['entries_parsed']:,.0f}",
            f"{r['bill_s']:.2f} ({r['bill_cpu_s']:.2f})",
            "-"
            if r["bill_from_scratch_s"] is None
            else f"{r['bill_from_scratch_s']:.2f} ({r['bill_from_scratch_cpu_s']:.2f})",
            f"{r['bill_peak_mib']:.1f}",
            f"{r['spend_s']:.2f} ({r['spend_cpu_s']:.2f})",
            f"{r['spend_parsed_s']:.2f} ({r['spend_parsed_cpu_s']:.2f})",
        )
    Console(width=180).print(table)
    out = Path(__file__).resolve().parent / "results" / "ledger_bench.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(runs, indent=2) + "\n")


if __name__ == "__main__":
    main()
