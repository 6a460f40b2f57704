"""E6 ledger: append-only, balanced, double-entry, auditable back to job-seconds.

Every entry moves credits between exactly two accounts with two postings that sum to zero:

    grant   grants:<period>  -c   →  team:<name>      +c   (a period's budget, E1)
    charge  team:<name>      -c   →  cluster:revenue  +c   (GPU-seconds a job held)
    refund  cluster:revenue  -c   →  team:<name>      +c   (part or all of one earlier charge)

So `balance("team:<name>")` is what the team was granted less what it paid, `cluster:revenue` is
net income and every `grants:<period>` is minus what that period handed out; all balances sum to
zero. Balances are always summed from postings (`math.fsum`), never kept as running totals, so
they cannot drift from the entries.

A charge carries the job id, GPU type, tier, GPU count and the interval [start, end) that caused
it, with `gpu_seconds = gpus × (end - start)`, plus the list price and discount it was billed at,
so `credits == price × gpu_seconds / 3600 × (1 - discount)` can be rechecked by an auditor. A
refund names the charge it returns (`refund_of`) and can never return more than that charge less
its earlier refunds; a refund of some of a charge's seconds names them too ([start, end), inside
the charge's interval), so an audit still adds up to job-seconds.

A ledger may hold only the tail of a longer book (`resume`, `forget`): the balances of the
entries before it (each summed from their postings, by the database or by this ledger before it
forgot them) and the earlier charges a later entry may still refund or grow. So a service that
has posted for years keeps in memory, and reads at start, what is still open, not its history;
the database keeps every entry.

Entries are frozen and the ledger has no delete: a mistake is corrected by a refund. The one
change it allows is `extend`: a charge nothing refers to yet may grow to a later end, so a job
charged as it runs (E5) has one charge per stretch of its run, not one per minute; every second
it covers was charged when the ledger said so, and each version is a charge in its own right.
`to_jsonl`/`from_jsonl` write and read one JSON object per line; reading re-validates every entry
exactly as posting does, so a hand-edited file that breaks an invariant is refused.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpu_arbiter.domain import ArbiterError, InvalidInput, Tier
from gpu_arbiter.domain.config_files import first_error

GRANT = "grant"
CHARGE = "charge"
REFUND = "refund"
REVENUE = "cluster:revenue"
_KINDS = (GRANT, CHARGE, REFUND)


def team_account(team: str) -> str:
    return f"team:{team}"


def grants_account(period: str) -> str:
    return f"grants:{period}"


class LedgerError(ArbiterError):
    """The ledger broke one of its invariants; only a bug or a tampered store can cause it."""


@dataclass(frozen=True, slots=True)
class Posting:
    """`amount` credits added to `account`'s balance (negative: taken from it)."""

    account: str
    amount: float


@dataclass(frozen=True, slots=True)
class Entry:
    """One immutable ledger line. `seq` is its position; fields not used by `kind` are None."""

    seq: int
    kind: str
    at: float
    team: str
    credits: float
    postings: tuple[Posting, Posting]
    reason: str
    period: str | None = None
    job_id: str | None = None
    gpu_type: str | None = None
    tier: Tier | None = None
    gpus: float | None = None
    start: float | None = None
    end: float | None = None
    gpu_seconds: float | None = None
    preemptible: bool | None = None
    price: float | None = None
    discount: float | None = None
    useful_gpu_seconds: float | None = None
    refund_of: int | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict; fields that are None are left out to keep lines short."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "postings":
                value = [[p.account, p.amount] for p in value]
            elif f.name == "tier" and value is not None:
                value = int(value)
            if value is not None:
                out[f.name] = value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = "ledger entry") -> Entry:
        """An entry from its `to_json` dict, its types checked (the ledger checks the rest)."""
        try:
            return _EntryModel.model_validate(data).to_entry()
        except ValidationError as e:
            raise first_error(where, e) from None


class Ledger:
    """The append-only book. Posting methods validate first and change nothing on error."""

    def __init__(self) -> None:
        self._entries: list[Entry] = []
        # A tail of a longer book: _entries[0] has seq _base; the balances of the entries before
        # it, and those of them that may still be refunded or grown (charges of open segments).
        self._base = 0
        self._opening: dict[str, float] = {}
        self._known: dict[int, Entry] = {}
        # Indexes of entry positions, rebuilt from the entries themselves (derived, not state).
        self._by_account: dict[str, list[int]] = {}
        self._by_job: dict[str, list[int]] = {}
        self._refunded: dict[int, float] = {}

    def __len__(self) -> int:
        """Entries in the whole book, those forgotten included: the next entry's seq."""
        return self._base + len(self._entries)

    @classmethod
    def resume(
        cls,
        next_seq: int,
        opening: Mapping[str, float],
        open_charges: Iterable[Entry] = (),
    ) -> Ledger:
        """A ledger that carries on a book of `next_seq` entries it does not hold: `opening`
        is each account's balance in that book, `open_charges` the charges of it that later
        entries may refund or grow (none of them refunded yet)."""
        ledger = cls()
        ledger._base = next_seq
        ledger._opening = dict(opening)
        for e in open_charges:
            if e.kind != CHARGE or not 0 <= e.seq < next_seq:
                raise InvalidInput(f"resume: entry {e.seq} is not an earlier charge")
            _check(e, e.seq)
            ledger._known[e.seq] = e
            ledger._by_job.setdefault(e.job_id or "", []).append(e.seq)
        for seqs in ledger._by_job.values():
            seqs.sort()
        return ledger

    def forget(self, keep: Iterable[int]) -> None:
        """Let go of the entries held, keeping each account's balance and the charges `keep`
        (those that may still be refunded or grown), so memory does not grow with history."""
        known = {seq: self._at(seq) for seq in keep}
        refunded = {seq: self._refunded[seq] for seq in known if seq in self._refunded}
        self._opening = {a: self.balance(a) for a in {*self._opening, *self._by_account}}
        self._base = len(self)
        self._entries = []
        self._known = known
        self._refunded = refunded
        self._by_account = {}
        self._by_job = {}
        for seq in sorted(known):
            self._by_job.setdefault(known[seq].job_id or "", []).append(seq)

    # -- posting -------------------------------------------------------------------------------

    def grant(self, team: str, credits: float, period: str, at: float) -> Entry:
        """Give `team` its budget for `period` (E1)."""
        return self._append(
            Entry(
                seq=len(self),
                kind=GRANT,
                at=float(at),
                team=team,
                credits=float(credits),
                postings=_postings(GRANT, team, float(credits), period),
                reason=f"budget for {period}",
                period=period,
            )
        )

    def charge(
        self,
        job_id: str,
        team: str,
        credits: float,
        gpu_type: str,
        tier: Tier | int,
        start: float,
        end: float,
        gpus: float,
        reason: str,
        at: float,
        *,
        preemptible: bool = False,
        price: float | None = None,
        discount: float = 0.0,
        useful_gpu_seconds: float | None = None,
    ) -> Entry:
        """Charge `team` for `gpus` GPUs of `gpu_type` held by `job_id` over [start, end)."""
        seq, credits, gpus = len(self), float(credits), float(gpus)
        start, end = float(start), float(end)
        return self._append(
            Entry(
                seq=seq,
                kind=CHARGE,
                at=float(at),
                team=team,
                credits=credits,
                postings=_postings(CHARGE, team, credits),
                reason=reason,
                job_id=job_id,
                gpu_type=gpu_type,
                tier=_tier(tier, seq),
                gpus=gpus,
                start=start,
                end=end,
                gpu_seconds=gpus * (end - start),
                preemptible=preemptible,
                price=_opt_float(price),
                discount=float(discount),
                useful_gpu_seconds=_opt_float(useful_gpu_seconds),
            )
        )

    def refund(
        self,
        of_entry: Entry | int,
        credits: float,
        reason: str,
        at: float,
        start: float | None = None,
        end: float | None = None,
    ) -> Entry:
        """Return `credits` of an earlier charge to its team; `start`/`end` name the seconds of
        the charge returned when it is not all of them."""
        seq = of_entry.seq if isinstance(of_entry, Entry) else of_entry
        original = self._charge_at(seq, len(self))
        if isinstance(of_entry, Entry) and of_entry != original:
            raise InvalidInput(f"refund: entry {seq} is not the charge in this ledger")
        return self._append(
            Entry(
                seq=len(self),
                kind=REFUND,
                at=float(at),
                team=original.team,
                credits=float(credits),
                postings=_postings(REFUND, original.team, float(credits)),
                reason=reason,
                job_id=original.job_id,
                start=_opt_float(start),
                end=_opt_float(end),
                refund_of=seq,
            )
        )

    def extend(self, charge: Entry, end: float, credits: float, at: float) -> Entry:
        """The charge `charge` carried on to `end` for `credits` in all, dated `at`: the same
        entry (same seq) over a longer interval. Only a charge that has no refund may grow, and
        never backwards, so nothing that was ever charged is taken away by it."""
        original = self._charge_at(charge.seq, charge.seq)
        if original != charge:
            raise InvalidInput(f"extend: entry {charge.seq} is not the charge in this ledger")
        assert original.start is not None and original.end is not None
        assert original.gpus is not None
        if charge.seq in self._refunded:
            raise InvalidInput(f"extend: charge {charge.seq} has refunds; post a new charge")
        if end < original.end or credits < original.credits or at < original.at:
            raise InvalidInput(f"extend: charge {charge.seq} may only grow")
        grown = replace(
            original,
            end=float(end),
            at=float(at),
            credits=float(credits),
            postings=_postings(CHARGE, original.team, float(credits)),
            gpu_seconds=original.gpus * (float(end) - original.start),
        )
        _check(grown, grown.seq)
        if grown.seq < self._base:
            self._known[grown.seq] = grown
            for p, q in zip(original.postings, grown.postings, strict=True):
                self._opening[p.account] = self._opening.get(p.account, 0.0) + q.amount - p.amount
        else:
            self._entries[grown.seq - self._base] = grown
        return grown

    # -- reading -------------------------------------------------------------------------------

    def entry(self, seq: int) -> Entry:
        """The entry at position `seq`."""
        if not (self._base <= seq < len(self) or seq in self._known):
            raise InvalidInput(f"ledger: no entry {seq}")
        return self._at(seq)

    def balance(self, account: str) -> float:
        held = (
            p.amount
            for i in self._by_account.get(account, ())
            for p in self._at(i).postings
            if p.account == account
        )
        return math.fsum([self._opening.get(account, 0.0), *held])

    def entries(self, account: str | None = None, since: int = 0) -> tuple[Entry, ...]:
        """The entries held, or those of them touching `account`, from seq `since` on, so a
        reader that folds the ledger incrementally only looks at what is new."""
        if account is None:
            return tuple(self._entries[max(0, since - self._base) :])
        seqs = self._by_account.get(account, [])
        return tuple(self._at(i) for i in seqs[bisect_left(seqs, since) :])

    def audit(self, job_id: str) -> tuple[Entry, ...]:
        """Every charge and refund of `job_id`, in order: each charge names its GPU-seconds."""
        return tuple(self._at(i) for i in self._by_job.get(job_id, ()))

    def refunded(self, charge: Entry | int) -> float:
        """Credits already refunded of a charge."""
        return self._refunded.get(charge.seq if isinstance(charge, Entry) else charge, 0.0)

    def refundable(self, charge: Entry) -> float:
        """Credits of a charge that may still be refunded. Never below 0: refunds may exceed
        what is left by a rounding error (`_append`), so the charge less its refunds can come
        out a hair below 0, which no refund may be."""
        return max(0.0, charge.credits - self.refunded(charge))

    def check_balanced(self) -> None:
        """Raise `LedgerError` unless every entry held and the whole book sum to zero. The
        opening balances of a tail were each rounded once, so their sum may miss zero by that
        rounding (1e-9 of their size), never by a missing or unbalanced entry."""
        for e in self._entries:
            if len(e.postings) != 2 or math.fsum(p.amount for p in e.postings) != 0.0:
                raise LedgerError(f"ledger entry {e.seq} does not balance: {e.postings}")
        total = math.fsum(p.amount for e in self._entries for p in e.postings)
        if total != 0.0:
            raise LedgerError(f"ledger does not balance: postings sum to {total}")
        opening = math.fsum(self._opening.values())
        size = math.fsum(abs(v) for v in self._opening.values())
        if abs(opening) > 1e-9 * max(1.0, size):
            raise LedgerError(f"ledger does not balance: opening balances sum to {opening}")

    # -- files ---------------------------------------------------------------------------------

    def to_jsonl(self, path: str | Path) -> None:
        with Path(path).open("w") as f:
            for e in self._entries:
                f.write(json.dumps(e.to_json(), allow_nan=False) + "\n")

    @classmethod
    def from_jsonl(cls, path: str | Path) -> Ledger:
        p = Path(path)
        try:
            lines = p.read_text().splitlines()
        except OSError as e:
            raise InvalidInput(f"ledger file {p}: cannot read ({e.strerror})") from None
        return cls.from_lines(lines, source=f"ledger file {p}")

    @classmethod
    def from_lines(cls, lines: Iterable[str], source: str = "ledger") -> Ledger:
        """Rebuild a ledger from JSON lines, re-checking every invariant of posting."""
        ledger = cls()
        for n, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{source} line {n}"
            try:
                model = _EntryModel.model_validate_json(line)
            except ValidationError as e:
                raise first_error(where, e) from None
            try:
                ledger._append(model.to_entry())
            except InvalidInput as e:
                raise InvalidInput(f"{where}: {e}") from None
        return ledger

    # -- internals -----------------------------------------------------------------------------

    def _append(self, entry: Entry) -> Entry:
        _check(entry, len(self))
        if entry.kind == REFUND:
            assert entry.refund_of is not None
            original = self._charge_at(entry.refund_of, entry.seq)
            left = original.credits - self.refunded(original)
            if entry.credits > left + 1e-9 * max(1.0, original.credits):
                raise InvalidInput(
                    f"refund: {entry.credits} credits exceed the {left} left of charge "
                    f"{original.seq}"
                )
            if (entry.team, entry.job_id) != (original.team, original.job_id):
                raise InvalidInput(f"refund: team and job must match charge {original.seq}")
            if entry.start is not None:
                assert entry.end is not None and original.start is not None
                if entry.start < original.start or entry.end > (original.end or 0.0):
                    raise InvalidInput(
                        f"refund: seconds [{entry.start}, {entry.end}) are not all in charge "
                        f"{original.seq} [{original.start}, {original.end})"
                    )
        self._entries.append(entry)
        for p in entry.postings:
            self._by_account.setdefault(p.account, []).append(entry.seq)
        if entry.job_id is not None:
            self._by_job.setdefault(entry.job_id, []).append(entry.seq)
        if entry.refund_of is not None:
            self._refunded[entry.refund_of] = self.refunded(entry.refund_of) + entry.credits
        return entry

    def _charge_at(self, seq: int, now_seq: int) -> Entry:
        held = self._base <= seq < len(self) or seq in self._known
        if not held or self._at(seq).kind != CHARGE:
            raise InvalidInput(f"ledger entry {now_seq}: refund_of {seq} is not a charge")
        return self._at(seq)

    def _at(self, seq: int) -> Entry:
        return self._entries[seq - self._base] if seq >= self._base else self._known[seq]


def _postings(
    kind: str, team: str, credits: float, period: str | None = None
) -> tuple[Posting, Posting]:
    """The only two-posting shapes the ledger accepts, one per kind (`_shape`)."""
    a, x, b, y = _shape(kind, team, credits, period)
    return Posting(a, x), Posting(b, y)


def _shape(
    kind: str, team: str, credits: float, period: str | None = None
) -> tuple[str, float, str, float]:
    """(account taken from, amount, account added to, amount) of an entry of the kind."""
    acct = team_account(team)
    if kind == GRANT:
        return grants_account(period or ""), -credits, acct, credits
    if kind == CHARGE:
        return acct, -credits, REVENUE, credits
    return REVENUE, -credits, acct, credits


def _opt_float(value: float | None) -> float | None:
    return None if value is None else float(value)


def _tier(tier: Tier | int, seq: int) -> Tier:
    if tier.__class__ is Tier:
        return tier
    try:
        return Tier(tier)
    except ValueError:
        raise InvalidInput(f"ledger entry {seq}: tier must be 1, 2 or 3, got {tier!r}") from None


def _finite(value: float | None, name: str, where: str, minimum: float | None = None) -> None:
    if value is None or not math.isfinite(value):
        raise InvalidInput(f"{where}: {name} must be a finite number, got {value}")
    if minimum is not None and value < minimum:
        raise InvalidInput(f"{where}: {name} must be >= {minimum}, got {value}")


def _all_finite(*values: float | None) -> bool:
    """Whether every value is a finite number (None is not)."""
    for v in values:
        if v is None or not math.isfinite(v):
            return False
    return True


def _balanced(e: Entry) -> bool:
    """Whether the entry's postings are those `_postings` builds for its kind, team, credits
    and period (compared field by field, as `==` on them would, without building them)."""
    ps = e.postings
    if not isinstance(ps, tuple) or len(ps) != 2:
        return False
    out, into = ps
    if out.__class__ is not Posting or into.__class__ is not Posting:
        return False
    a, x, b, y = _shape(e.kind, e.team, e.credits, e.period)
    return out.account == a and out.amount == x and into.account == b and into.amount == y


def _check(e: Entry, seq: int) -> None:
    """Refuse an entry that is not exactly what the posting method for its kind would build."""
    where = f"ledger entry {seq}"
    if e.seq != seq:
        raise InvalidInput(f"{where}: seq must be {seq}, got {e.seq}")
    if e.kind not in _KINDS:
        raise InvalidInput(f"{where}: kind must be one of {', '.join(_KINDS)}, got {e.kind!r}")
    if not e.team:
        raise InvalidInput(f"{where}: team must not be empty")
    if not e.reason:
        raise InvalidInput(f"{where}: reason must not be empty")
    _finite(e.at, "at", where)
    _finite(e.credits, "credits", where, minimum=0.0)
    if e.kind == GRANT and not e.period:
        raise InvalidInput(f"{where}: a grant needs a period")
    if not _balanced(e):
        raise InvalidInput(f"{where}: postings do not match a balanced {e.kind}")
    if e.kind == REFUND and e.refund_of is None:
        raise InvalidInput(f"{where}: a refund needs refund_of")
    if e.kind == REFUND and (e.start is not None or e.end is not None):
        _finite(e.start, "start", where)
        _finite(e.end, "end", where)
        assert e.start is not None and e.end is not None
        if e.end < e.start:
            raise InvalidInput(f"{where}: end ({e.end}) must not be before start ({e.start})")
    if e.kind != CHARGE:
        return
    if not e.job_id or not e.gpu_type or e.tier is None:
        raise InvalidInput(f"{where}: a charge needs job_id, gpu_type and tier")
    if not _all_finite(e.gpus, e.start, e.end, e.discount) or e.discount < 0.0:
        _finite(e.gpus, "gpus", where)  # (one of them raises, naming the first that is wrong)
        _finite(e.start, "start", where)
        _finite(e.end, "end", where)
        _finite(e.discount, "discount", where, minimum=0.0)
    assert e.gpus is not None and e.start is not None and e.end is not None
    if e.gpus <= 0:
        raise InvalidInput(f"{where}: gpus must be > 0, got {e.gpus}")
    if e.end < e.start:
        raise InvalidInput(f"{where}: end ({e.end}) must not be before start ({e.start})")
    held = e.gpus * (e.end - e.start)
    if e.gpu_seconds is None or not math.isclose(e.gpu_seconds, held, rel_tol=1e-9, abs_tol=1e-9):
        raise InvalidInput(f"{where}: gpu_seconds must be gpus × (end - start) = {held}")
    if e.price is not None:
        _finite(e.price, "price", where, minimum=0.0)
    if e.useful_gpu_seconds is not None:
        _finite(e.useful_gpu_seconds, "useful_gpu_seconds", where, minimum=0.0)
        if e.useful_gpu_seconds > held * (1 + 1e-9) + 1e-9:
            raise InvalidInput(
                f"{where}: useful_gpu_seconds ({e.useful_gpu_seconds}) exceed gpu_seconds ({held})"
            )


_Finite = Annotated[float, Field(allow_inf_nan=False)]


class _EntryModel(BaseModel):
    """The JSON-lines shape of an `Entry`; types only, the ledger checks the invariants."""

    model_config = ConfigDict(extra="forbid")

    seq: int
    kind: Literal["grant", "charge", "refund"]
    at: _Finite
    team: str
    credits: _Finite
    postings: tuple[tuple[str, _Finite], tuple[str, _Finite]]
    reason: str
    period: str | None = None
    job_id: str | None = None
    gpu_type: str | None = None
    tier: Literal[1, 2, 3] | None = None
    gpus: _Finite | None = None
    start: _Finite | None = None
    end: _Finite | None = None
    gpu_seconds: _Finite | None = None
    preemptible: bool | None = None
    price: _Finite | None = None
    discount: _Finite | None = None
    useful_gpu_seconds: _Finite | None = None
    refund_of: int | None = None

    def to_entry(self) -> Entry:
        data = self.model_dump()
        (a, x), (b, y) = data.pop("postings")
        tier = data.pop("tier")
        return Entry(
            **data,
            postings=(Posting(a, x), Posting(b, y)),
            tier=None if tier is None else Tier(tier),
        )
