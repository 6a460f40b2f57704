"""What running jobs cost as they run: the run segment each job is in, the charges posted for
it (at its end, and every `accrue_s` while it runs, by growing one charge in place), the
ledger's write-out, each team's spend, and the gauges /metrics shows.

Separate from the loop because it is the one place that turns GPU-seconds into ledger entries:
a start, a requeue, an end, a demotion or a restart each open or close a segment here, and the
ledger is the only record of what was charged, so a restart never charges a second twice.

The ledger in memory holds only what is open: at start it resumes from the database's sums
(`books.py`), and once it holds `keep_at_most` written entries it forgets them but for the
charges of open segments, so neither a restart nor a long uptime costs time or memory in
proportion to the ledger's history.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, update
from sqlalchemy.engine import Connection

from gpu_arbiter.control.books import read_books
from gpu_arbiter.control.jobrows import LiveJob
from gpu_arbiter.control.metrics import Metrics
from gpu_arbiter.control.state import LoopState
from gpu_arbiter.control.store import LEDGER, insert_rows, setting
from gpu_arbiter.domain import JobSpec, Team
from gpu_arbiter.economy import (
    CHARGE,
    FAILURE_ABSORBED,
    REFUND,
    RUN,
    Budgets,
    ChargeModel,
    Entry,
    Ledger,
    PriceTable,
    is_preemptible,
)
from gpu_arbiter.economy.chargeback import LOST_WORK, RERUN


def ledger_row(e: Entry, ledger: Ledger) -> dict[str, object]:
    """The ledger table's row of an entry of `ledger`: the entry itself as JSON, plus the
    columns the start-up sums, the bills and the dashboard's queries sum and filter on."""
    return {
        "seq": e.seq,
        "kind": e.kind,
        "team": e.team,
        "job_id": e.job_id,
        "at": e.at,
        "credits": e.credits,
        "lost_gpu_seconds": lost_gpu_seconds(e, ledger),
        "reason": e.reason,
        "gpu_type": e.gpu_type,
        "tier": None if e.tier is None else int(e.tier),
        "gpu_seconds": e.gpu_seconds,
        "useful_gpu_seconds": e.useful_gpu_seconds,
        "entry": e.to_json(),
    }


def lost_gpu_seconds(e: Entry, ledger: Ledger) -> float:
    """The GPU-seconds a failure lost that entry `e` of `ledger` records (F2): a "lost-work"
    or "rerun" charge's, and those of a running job's charge given back when it failed (a
    "failure-absorbed" refund naming its seconds; the refund of a "lost-work" charge names
    none, as the charge counted them)."""
    if e.kind == CHARGE and e.reason in (LOST_WORK, RERUN):
        assert e.gpu_seconds is not None
        return e.gpu_seconds
    if e.kind == REFUND and e.reason == FAILURE_ABSORBED and e.start is not None:
        assert e.refund_of is not None and e.end is not None
        gpus = ledger.entry(e.refund_of).gpus
        assert gpus is not None
        return gpus * (e.end - e.start)
    return 0.0


@dataclass(slots=True)
class Segment:
    """The run segment a job is in: what it holds since when, up to when it was charged
    while it ran (`billed_to`, from the ledger after a restart), and the seq of the "run"
    charge that says so (`accrual`), which the next accrual grows when it can."""

    start: float
    gpu_type: str
    gpus: int
    tier: int
    borrowed: bool
    billed_to: float
    accrual: int | None = None


class Accounts:
    """The loop's books: the ledger's open tail and how much of the book is in the database
    (`persisted`), the price table (`charges`), budgets, spend and burn rate per team, and the
    open segments."""

    def __init__(self, metrics: Metrics, accrue_s: float, keep_at_most: int = 10_000) -> None:
        self.metrics = metrics
        self.accrue_s = accrue_s
        self.keep_at_most = keep_at_most
        self.ledger = Ledger()
        self.persisted = 0
        self.lost_gpu_s = 0.0  # what the lost-GPU-hours counter has counted
        # Charges already in the database that grew since: seq -> the credits written.
        self.grown: dict[int, float] = {}
        self.spent: dict[str, float] = {}
        self.burn: dict[str, float] = {}
        self.charges = ChargeModel()
        self.budgets = Budgets(self.ledger, {})
        self.segs: dict[str, Segment] = {}
        self.last_accrual = 0.0
        self.last_budget_check = 0.0

    def load(self, conn: Connection, now: float) -> None:
        """The price table, and the ledger resumed from the database's sums (`books.py`):
        balances, spend, the budget period `now` is in, the open segments' charges."""
        prices = setting(conn, "prices")
        self.charges = ChargeModel(PriceTable.from_dict(prices) if prices else PriceTable())
        budgets = self.budgets
        index = budgets.period_index(now)
        books = read_books(
            conn, index, budgets.period_start(index), budgets.period_start(index + 1)
        )
        self.ledger = Ledger.resume(books.next_seq, books.opening, books.open_charges)
        self.budgets = Budgets(self.ledger, budgets.budgets, budgets.policy)
        self.budgets.seed(books.period_net, books.granted)
        self.persisted = len(self.ledger)
        self.grown = {}
        self.spent = books.spent
        self.metrics.lost_gpu_hours.inc(max(0.0, books.lost_gpu_seconds - self.lost_gpu_s) / 3600)
        self.lost_gpu_s = max(self.lost_gpu_s, books.lost_gpu_seconds)

    def set_teams(self, teams: Iterable[Team]) -> None:
        self.budgets.set_budgets(
            {t.name: t.budget_per_period for t in teams if t.budget_per_period is not None}
        )

    # -- run segments ----------------------------------------------------------------------

    def open(
        self, job_id: str, now: float, gpu_type: str, gpus: int, tier: int, borrowed: bool
    ) -> None:
        """The job holds `gpus` GPUs of `gpu_type` from now on, charged at `tier`."""
        self.segs[job_id] = Segment(now, gpu_type, gpus, tier, borrowed, now)

    def reopen(self, job_id: str, row: Mapping[str, Any]) -> None:
        """A running job's segment from its row after a restart, charged up to where the
        ledger says it was."""
        accrued = self.accrued(job_id, row["seg_start"])
        self.segs[job_id] = Segment(
            row["seg_start"],
            row["seg_gpu_type"],
            row["seg_gpus"],
            row["seg_tier"],
            row["seg_borrowed"],
            accrued[-1].end if accrued else row["seg_start"],
            accrued[-1].seq if accrued else None,
        )

    def close(
        self,
        job_id: str,
        spec: JobSpec | None,
        keeps_checkpoints: bool | None,
        now: float,
        lost_from: float | None = None,
        at: float | None = None,
    ) -> float:
        """Charge what is left of the job's run segment up to `at` (never past now nor before
        the segment began): the seconds since it was last charged (`accrue`), or less when
        the accrued charges went too far. Returns the end used. `spec` is None for a job the
        loop no longer keeps: nothing is charged then."""
        end = now if at is None else min(at, now)
        seg = self.segs.pop(job_id, None)
        if seg is None or spec is None:
            return end
        end = max(end, seg.start)
        self.charges.close_segment(
            self.ledger,
            spec,
            self.accrued(job_id, seg.start),
            gpu_type=seg.gpu_type,
            tier=seg.tier,
            gpus=seg.gpus,
            start=seg.start,
            end=end,
            preemptible=is_preemptible(seg.tier, seg.borrowed),
            lost_from=lost_from,
            keeps_checkpoints=keeps_checkpoints,
        )
        return end

    def lost_from(self, job_id: str, last_checkpoint_at: float | None) -> float | None:
        """Where a failure's lost work begins: the job's last checkpoint in its current run
        segment, else the segment's start (F2)."""
        seg = self.segs.get(job_id)
        lost_from = last_checkpoint_at
        if seg is not None and (lost_from is None or lost_from < seg.start):
            lost_from = seg.start
        return lost_from

    def accrued(self, job_id: str, seg_start: float) -> list[Entry]:
        """The charges posted for the job's run segment that began at `seg_start` while it
        ran; the ledger is their only record, so a restart never charges their seconds twice.
        (Charges of earlier segments all begin before it.)"""
        return [
            e
            for e in self.ledger.audit(job_id)
            if e.kind == CHARGE and e.reason == RUN and e.start is not None and e.start >= seg_start
        ]

    def accrue(self, now: float, live: Mapping[str, LiveJob]) -> bool:
        """Charge each running job for the seconds it held its GPUs once `accrue_s` have passed
        since it was last charged (E5): spend, burn and budgets see running work, not only runs
        that ended. The segment's charge grows (`ChargeModel.accrue`), so a long run leaves a
        few ledger rows, not one a minute, and the row says up to when it was charged. Each job
        falls due a minute after its own start, so the charges of many running jobs spread
        over the minute instead of stalling one tick (10,000 charges cost the loop about half
        a second). Returns whether budgets are due a check (every
        `accrue_s`): a team whose budget is spent then has its running jobs run as its budget
        allows (`Applier.exhausted`)."""
        due = now - self.accrue_s
        for job_id, seg in self.segs.items():
            job = live.get(job_id)
            if job is None or seg.billed_to > due or now <= seg.billed_to:
                continue
            last = None if seg.accrual is None else self.ledger.entry(seg.accrual)
            period = self.budgets.period_index
            entry = self.charges.accrue(
                self.ledger,
                job.spec,
                last,
                gpu_type=seg.gpu_type,
                tier=seg.tier,
                gpus=seg.gpus,
                start=seg.billed_to,
                end=now,
                preemptible=is_preemptible(seg.tier, seg.borrowed),
                same_period=last is not None and period(last.at) == period(now),
            )
            if last is not None and entry.seq == last.seq:
                self.budgets.grown(last, entry)
                if last.seq < self.persisted:
                    self.grown.setdefault(last.seq, last.credits)
            seg.billed_to, seg.accrual = now, entry.seq
        self.last_accrual = now
        if now - self.last_budget_check >= self.accrue_s:
            self.last_budget_check = now
            return True
        return False

    # -- the ledger in the database --------------------------------------------------------

    def flush(self, conn: Connection) -> None:
        """Write the ledger's new entries and the charges that grew, in the transaction that
        made them."""
        self._flush_grown(conn)
        new = self.ledger.entries(since=self.persisted)
        if not new:
            return
        insert_rows(conn, LEDGER, [ledger_row(e, self.ledger) for e in new])
        self.persisted += len(new)
        for e in new:
            self._count_spend(e)
        if len(self.ledger.entries()) > self.keep_at_most:
            self.forget()

    def forget(self) -> None:
        """Let the ledger forget the entries written, but for the charges of open segments
        (their end may refund them, their next accrual grow them); budgets fold them first."""
        self.budgets.fold()
        self.ledger.forget(
            e.seq for job_id, seg in self.segs.items() for e in self.accrued(job_id, seg.start)
        )

    def _flush_grown(self, conn: Connection) -> None:
        if not self.grown:
            return
        grown = [self.ledger.entry(seq) for seq in self.grown]
        conn.execute(
            update(LEDGER)
            .where(LEDGER.c.seq == bindparam("b_seq"))
            .values(
                at=bindparam("b_at"),
                credits=bindparam("b_credits"),
                gpu_seconds=bindparam("b_gpu_seconds"),
                entry=bindparam("b_entry"),
            ),
            [
                {
                    "b_seq": e.seq,
                    "b_at": e.at,
                    "b_credits": e.credits,
                    "b_gpu_seconds": e.gpu_seconds,
                    "b_entry": e.to_json(),
                }
                for e in grown
            ],
        )
        for e in grown:
            self.spent[e.team] = self.spent.get(e.team, 0.0) + e.credits - self.grown[e.seq]
        self.grown = {}

    def _count_spend(self, e: Entry) -> None:
        if e.kind == CHARGE:
            self.spent[e.team] = self.spent.get(e.team, 0.0) + e.credits
        elif e.kind == REFUND:
            self.spent[e.team] = self.spent.get(e.team, 0.0) - e.credits
        lost = lost_gpu_seconds(e, self.ledger)
        if lost:
            self.lost_gpu_s += lost
            self.metrics.lost_gpu_hours.inc(lost / 3600)


def observe(st: LoopState, accounts: Accounts, metrics: Metrics, last_cycle: Any) -> None:
    """Set the gauges /metrics shows from the engine, the nodes and the books (about once a
    second); `last_cycle` is the latest cycle's result, or None before the first."""
    m = metrics
    sched = st.sched
    if sched is None:
        return
    total = sched.cluster.total_gpus
    down = sum(sched.cluster.nodes[i].gpus for i, d in enumerate(sched.index.down) if d)
    busy = sum(j.gpus_held for j in sched.running.values())
    free = sched.index.total_free
    m.gpus.labels("total").set(total)
    m.gpus.labels("busy").set(busy)
    m.gpus.labels("free").set(free)
    m.gpus.labels("down").set(down)
    m.utilisation.set(busy / (total - down) if total > down else 0.0)
    if last_cycle is not None:
        m.fragmentation.set(last_cycle.fragmentation)
        m.stranded.set(last_cycle.stranded_gpus)
    counts: dict[tuple[str, str], float] = {}
    for job_id in st.live:
        job = sched.jobs.get(job_id)
        if job is not None:
            key = (job.state.value, str(int(job.tier)))
            counts[key] = counts.get(key, 0) + 1
    m.set_labelled(m.jobs, counts)
    states: dict[tuple[str], float] = {}
    for n in st.nodes.values():
        states[(n["state"],)] = states.get((n["state"],), 0) + 1
    m.set_labelled(m.nodes, states)
    accounts.burn = accounts.charges.burn_rates(sched.running.values())
    m.set_labelled(m.burn, {(t,): v for t, v in accounts.burn.items()})
    m.set_labelled(m.spent, {(t,): v for t, v in accounts.spent.items()})
