"""What every trace reader shares: options, read statistics and the streaming pipeline.

A reader only knows its file format: it yields raw records with their row numbers and turns one
record into a `TraceRecord` (the trace's own units) or a `Skip`. This module turns records into
`JobSpec`s the same way for every format: team and tier assignment, the conversion of observed
run times into reference seconds, walltime estimates, time scaling, limits, duplicate ids and the
strict / lenient handling of bad rows. Files are streamed twice (the first pass only finds the
earliest submit time, which becomes time 0) and never held in memory.
"""

from __future__ import annotations

import csv
import hashlib
import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from contextlib import closing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from gpu_arbiter.domain import MILLI, InvalidInput, JobSpec, Tier

WalltimeMode = Literal["round-hour", "exact", "none"]
DEFAULT_TEAMS: tuple[str, ...] = tuple(f"team-{c}" for c in "abcdef")
DEFAULT_TIER_MIX: tuple[float, float, float] = (0.15, 0.35, 0.50)
AUTO = "auto"  # team_field / tier_field: use the format's default
HASH = "hash"  # team_field: ignore the trace, hash jobs into `teams`
MIX = "mix"  # tier_field: ignore the trace, draw tiers from `tier_mix`
_KEPT_ROW_NUMBERS = 5  # bad-row numbers kept per reason, enough to find them in the file


@dataclass(frozen=True)
class TraceOptions:
    """How a trace becomes jobs where the trace itself says nothing (all choices are seeded).

    * `team_field`: the trace field whose value is the team name. "auto" (default) uses the
      format's choice: `vc` for Philly and Helios; the others have no team-like field and hash.
      "hash" puts each job into one of `teams` by a seeded hash of its user (when the trace
      names one, so a user's jobs stay together) or else of its id.
    * `teams`: names used by hashing; default six teams "team-a" .. "team-f".
    * `tier_field` and `tier_map`: the field whose value picks the tier and the value → tier
      mapping. "auto" uses the format's default (Alibaba `qos`: LS and Guaranteed → 1,
      Burstable → 2, BE → 3; Gavel `priority_class`, see `gavel.py`); `tier_map` None uses the
      format's default mapping. "mix" ignores the trace. A value missing from the mapping, and
      every job of a format without a usable field (Tiresias, Philly, Helios, PAI), gets a tier
      drawn from `tier_mix` by a seeded hash of the job id. A field other than the format's
      own needs a `tier_map`, and a `tier_map` a field (checked when the trace is opened).
    * `tier_mix`: shares of tiers 1, 2, 3; default 15% / 35% / 50%.
    * `walltime`: the user's estimate given to backfill. "round-hour" (default) is the estimate
      the trace records where it records one, else the observed run time rounded up to the
      next whole hour, as users ask for round time limits; "exact"
      is a perfect estimate; "none" gives no estimate.
    * `source_speed`: speed, relative to an H100, of the GPUs the trace's run times were
      measured on; None (default) uses each format's documented figure. Durations become
      reference seconds by multiplying with it, so a replay on the trace's own hardware takes
      as long as the trace says; 1.0 treats the trace's seconds as H100 seconds.
    * `time_scale`: multiplies every time (submits, durations, walltimes); default 1.0.
    * `limit`: stop after this many jobs; default None (all).
    * `strict`: a bad row raises `InvalidInput` naming file, row and field; default False,
      which counts the row in `ReadStats` and goes on.
    """

    team_field: str = AUTO
    teams: tuple[str, ...] = DEFAULT_TEAMS
    tier_field: str = AUTO
    tier_map: Mapping[str, int] | None = None
    tier_mix: tuple[float, float, float] = DEFAULT_TIER_MIX
    seed: int = 0
    walltime: WalltimeMode = "round-hour"
    source_speed: float | None = None
    time_scale: float = 1.0
    limit: int | None = None
    strict: bool = False

    def __post_init__(self) -> None:
        if not self.teams or any(not t for t in self.teams):
            raise InvalidInput("trace options: teams must be non-empty names")
        if len(set(self.teams)) != len(self.teams):
            raise InvalidInput(f"trace options: teams must be unique, got {self.teams}")
        if len(self.tier_mix) != 3 or any(not (s >= 0) for s in self.tier_mix):
            raise InvalidInput(
                f"trace options: tier_mix must be 3 shares >= 0, got {self.tier_mix}"
            )
        if abs(sum(self.tier_mix) - 1.0) > 1e-6:
            raise InvalidInput(f"trace options: tier_mix must sum to 1, got {self.tier_mix}")
        for value, tier in (self.tier_map or {}).items():
            if tier not in (1, 2, 3):
                raise InvalidInput(f"trace options: tier_map[{value!r}] must be 1, 2 or 3")
        if self.walltime not in ("round-hour", "exact", "none"):
            raise InvalidInput(
                f"trace options: walltime must be round-hour, exact or none, got {self.walltime!r}"
            )
        if self.source_speed is not None and not (0 < self.source_speed < math.inf):
            raise InvalidInput(f"trace options: source_speed must be > 0, got {self.source_speed}")
        if not (0 < self.time_scale < math.inf):
            raise InvalidInput(f"trace options: time_scale must be > 0, got {self.time_scale}")
        if self.limit is not None and self.limit < 1:
            raise InvalidInput(f"trace options: limit must be >= 1, got {self.limit}")

    def describe(self) -> str:
        """How jobs get tiers, teams and walltime estimates, in words (for reports)."""
        shares = " / ".join(f"{share:.0%}" for share in self.tier_mix)
        drawn = f"drawn {shares} (tiers 1 / 2 / 3)"
        if self.tier_field == MIX:
            tiers = drawn
        else:
            field = "the format's tier field" if self.tier_field == AUTO else self.tier_field
            if self.tier_map is not None:
                field += " (" + ", ".join(f"{v}={t}" for v, t in self.tier_map.items()) + ")"
            tiers = f"by {field}, else {drawn}"
        teams = {AUTO: "the format's team field, else hashed", HASH: "hashed"}.get(
            self.team_field, f"by {self.team_field}"
        )
        return f"tiers {tiers}; teams {teams}; walltime estimates {self.walltime}"


@dataclass
class ReadStats:
    """What happened to the rows of one trace; filled while the job iterator is consumed.

    `skipped` counts rows that are valid but are not GPU jobs to replay (cpu_only,
    zero_duration, unfinished, ...); `bad` counts rows that could not be read, by field, with
    the first few row numbers of each in `bad_rows` and the first message in `bad_first`
    (shown when no row at all could be read: it says what the reader expected). `warned`
    counts jobs read whose values disagree with each other, by what is wrong, with the first
    few row numbers in `warned_rows`. `times` counts jobs whose times the trace lacks and a
    reader took from elsewhere, by where (`TraceRecord.times_from`).
    """

    source: str
    rows: int = 0
    jobs: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    bad: Counter[str] = field(default_factory=Counter)
    bad_rows: dict[str, list[int]] = field(default_factory=dict)
    tiers: Counter[str] = field(default_factory=Counter)  # jobs by "by FIELD" or "drawn"
    bad_first: dict[str, str] = field(default_factory=dict)
    warned: Counter[str] = field(default_factory=Counter)
    warned_rows: dict[str, list[int]] = field(default_factory=dict)
    times: Counter[str] = field(default_factory=Counter)

    def add_bad(self, row: int, reason: str, message: str = "") -> None:
        self.bad[reason] += 1
        self.bad_first.setdefault(reason, message)
        kept = self.bad_rows.setdefault(reason, [])
        if len(kept) < _KEPT_ROW_NUMBERS:
            kept.append(row)

    def add_warning(self, row: int, what: str) -> None:
        self.warned[what] += 1
        kept = self.warned_rows.setdefault(what, [])
        if len(kept) < _KEPT_ROW_NUMBERS:
            kept.append(row)

    def summary(self) -> str:
        """One line, e.g. `x.csv: 8152 rows, 7064 jobs, 1088 skipped (cpu_only 1088), 0 bad`."""
        text = f"{self.source}: {self.rows} rows, {self.jobs} jobs"
        skipped = sum(self.skipped.values())
        text += f", {skipped} skipped"
        if skipped:
            text += " (" + ", ".join(f"{k} {n}" for k, n in sorted(self.skipped.items())) + ")"
        text += f", {sum(self.bad.values())} bad"
        if self.bad:
            parts = []
            for reason, n in sorted(self.bad.items()):
                part = f"{reason} {n}: rows {_rows(self.bad_rows[reason], n)}"
                if not self.jobs and self.bad_first.get(reason):
                    part += f" ({self.bad_first[reason]})"
                parts.append(part)
            text += " (" + "; ".join(parts) + ")"
        if self.tiers:
            text += "; tiers " + ", ".join(f"{n} {how}" for how, n in sorted(self.tiers.items()))
        if self.times:
            text += "; times " + ", ".join(f"{n} {how}" for how, n in self.times.most_common())
        if self.warned:
            text += "; WARNING: " + "; ".join(
                f"{n} jobs {what} (rows {_rows(self.warned_rows[what], n)})"
                for what, n in sorted(self.warned.items())
            )
        return text


def _rows(kept: list[int], n: int) -> str:
    """The row numbers kept of `n`, with "..." where there were more."""
    return ", ".join(map(str, kept)) + (", ..." if n > len(kept) else "")


class BadField(Exception):
    """Raised by a reader's `parse` for a row it cannot read; `field` names the culprit."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


@dataclass(frozen=True, slots=True)
class Skip:
    """A valid row that is deliberately not replayed; `reason` is counted in `ReadStats`."""

    reason: str


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One job as the trace states it, before options apply.

    `submit_s` is on the trace's own clock; `run_s` is the observed run time on hardware of
    speed `source_speed` (relative to an H100). `fields` are the named values that
    `team_field` and `tier_field` may pick from.
    """

    id: str
    submit_s: float
    run_s: float
    gpus: int
    source_speed: float
    fields: Mapping[str, str]
    gpu_milli: int = MILLI
    gpu_types: Mapping[str, float] = field(default_factory=dict)
    user: str | None = None
    command: str | None = None
    # What is suspect about a job that is still read (see `ReadStats.warned`).
    warnings: tuple[str, ...] = ()
    # What the user gave, where the trace records it (the cluster's own history does): the
    # walltime estimate in the trace's seconds and the checkpoint interval.
    walltime_s: float | None = None
    checkpoint_interval_s: float | None = None
    # Where submit and run times came from when the trace has none of its own (counted in
    # `ReadStats.times`); None: from the trace.
    times_from: str | None = None


class Reporter:
    """Where a bad row goes: an `InvalidInput` in strict mode, a count otherwise.

    `prefix` tells apart the reasons of a side file (PAI's task table) in the shared stats.
    """

    def __init__(self, source: str, stats: ReadStats, strict: bool, prefix: str = "") -> None:
        self.source = source
        self.stats = stats
        self.strict = strict
        self.prefix = prefix

    def bad(self, row: int, field_name: str, message: str) -> None:
        if self.strict:
            raise InvalidInput(f"{self.source}: row {row}: {field_name}: {message}")
        self.stats.add_bad(row, self.prefix + field_name, message)


RecordPass = Callable[[Reporter], Generator[tuple[int, Any], None, None]]


class TraceReader(ABC):
    """One trace format. Subclasses set the class attributes and implement `records`/`parse`.

    `records` prepares a file once (it may index a side file, reporting its bad rows to
    `report`; `options.seed` seeds whatever it draws) and returns a `RecordPass`: each call
    reads the file again from the start, yielding (row number, raw record) and sending rows
    it cannot split to the given reporter.
    `parse` maps one raw record to a `TraceRecord` or a `Skip`, or raises `BadField`.
    """

    name: str = ""
    fields: frozenset[str] = frozenset()
    team_field: str | None = None
    tier_field: str | None = None
    tier_map: Mapping[str, int] = {}

    def tier_field_for(self, options: TraceOptions) -> str | None:
        """The field the options read tiers from: the format's own for "auto" (None: it has
        none), else as given ("mix": none)."""
        return self.tier_field if options.tier_field == AUTO else options.tier_field

    def locate(self, path: Path) -> Path:
        """The file to read for `path`; refuses one that does not exist."""
        if not path.is_file():
            raise InvalidInput(f"{self.name} trace: file not found: {path}")
        return path

    @abstractmethod
    def records(self, path: Path, report: Reporter, options: TraceOptions) -> RecordPass: ...

    @abstractmethod
    def parse(self, row: int, record: Any) -> TraceRecord | Skip: ...

    def read(
        self,
        path: str | Path,
        options: TraceOptions | None = None,
        stats: ReadStats | None = None,
    ) -> Iterator[JobSpec]:
        """Stream the jobs of the trace at `path`; `stats` fills as the iterator is consumed.

        Checks the file and the options at once, so a wrong path or field fails here rather
        than at the first job.
        """
        options = options or TraceOptions()
        located = self.locate(Path(path))
        for opt, special, value in (
            ("team_field", HASH, options.team_field),
            ("tier_field", MIX, options.tier_field),
        ):
            if value not in (AUTO, special) and value not in self.fields:
                known = ", ".join(sorted(self.fields))
                raise InvalidInput(
                    f"{self.name} trace: {opt} {value!r} is not a field of this format; "
                    f"use {AUTO!r}, {special!r} or one of: {known}"
                )
        tier_field = self.tier_field_for(options)
        if options.tier_map is None and tier_field not in (None, MIX, self.tier_field):
            # The format's map is for its own field: every job would be drawn from the mix.
            raise InvalidInput(
                f"{self.name} trace: tier_field {tier_field!r} needs a tier_map "
                "(which of its values is which tier)"
            )
        if options.tier_map is not None and tier_field in (None, MIX):
            raise InvalidInput(
                f"{self.name} trace: a tier_map needs a tier_field that names a field of the "
                f"trace (tier_field is {options.tier_field!r})"
            )
        stats = stats if stats is not None else ReadStats(source=str(located))
        return self._jobs(located, options, stats)

    def _jobs(self, path: Path, options: TraceOptions, stats: ReadStats) -> Iterator[JobSpec]:
        report = Reporter(str(path), stats, options.strict)
        read_pass = self.records(path, report, options)
        scratch = Reporter(str(path), ReadStats(source=str(path)), options.strict)
        first = self._candidates(read_pass, options, scratch)
        origin = min((r.submit_s for r, _ in first), default=0.0)
        assign = _Assigner(self, options)
        for record, row in self._candidates(read_pass, options, report):
            try:
                spec, tier_source = assign.spec(record, origin)
            except InvalidInput as exc:
                report.bad(row, "job", str(exc))
                continue
            stats.jobs += 1
            stats.tiers[tier_source] += 1
            if record.times_from is not None:
                stats.times[record.times_from] += 1
            yield spec

    def _candidates(
        self, read_pass: RecordPass, options: TraceOptions, report: Reporter
    ) -> Iterator[tuple[TraceRecord, int]]:
        """Parsed, de-duplicated records up to the limit; both passes see exactly the same.

        Ids are remembered to refuse duplicates: memory grows with the number of jobs (as it
        does for whoever keeps the jobs), not with the file.
        """
        seen: set[str] = set()
        with closing(read_pass(report)) as rows:
            for row, raw in rows:
                if options.limit is not None and len(seen) >= options.limit:
                    return
                report.stats.rows += 1
                try:
                    parsed = self.parse(row, raw)
                except BadField as exc:
                    report.bad(row, exc.field, exc.message)
                    continue
                if isinstance(parsed, Skip):
                    report.stats.skipped[parsed.reason] += 1
                    continue
                if parsed.id in seen:
                    report.bad(row, "id", f"duplicate job id {parsed.id!r}")
                    continue
                seen.add(parsed.id)
                for what in parsed.warnings:
                    report.stats.add_warning(row, what)
                yield parsed, row


class _Assigner:
    """Applies the options to one record: team, tier, units, walltime."""

    def __init__(self, reader: TraceReader, options: TraceOptions) -> None:
        self.options = options
        self.team_field = reader.team_field if options.team_field == AUTO else options.team_field
        self.tier_field = reader.tier_field_for(options)
        self.tier_map = reader.tier_map if options.tier_map is None else options.tier_map
        mix = options.tier_mix
        self.tier_edges = (mix[0], mix[0] + mix[1])

    def team(self, record: TraceRecord) -> str:
        if self.team_field not in (None, HASH):
            value = record.fields.get(self.team_field, "")
            if value:
                return value
        teams = self.options.teams
        return teams[
            int(unit_hash(self.options.seed, "team", record.user or record.id) * len(teams))
        ]

    def tier(self, record: TraceRecord) -> tuple[Tier, str]:
        """The record's tier, and where it came from: "by FIELD" or "drawn"."""
        if self.tier_field not in (None, MIX):
            mapped = self.tier_map.get(record.fields.get(self.tier_field, ""))
            if mapped is not None:
                return Tier(mapped), f"by {self.tier_field}"
        u = unit_hash(self.options.seed, "tier", record.id)
        if u < self.tier_edges[0]:
            return Tier.CORE, "drawn"
        return (Tier.BUSINESS if u < self.tier_edges[1] else Tier.EXPLORATORY), "drawn"

    def spec(self, record: TraceRecord, origin: float) -> tuple[JobSpec, str]:
        """The job, and where its tier came from (`tier`)."""
        opts = self.options
        to_reference = (opts.source_speed or record.source_speed) * opts.time_scale
        if opts.walltime == "round-hour" and record.walltime_s is not None:
            walltime: float | None = record.walltime_s * opts.time_scale  # the user's own
        elif opts.walltime == "round-hour":
            walltime = math.ceil(record.run_s / 3600.0) * 3600.0 * to_reference
        elif opts.walltime == "exact":
            walltime = record.run_s * to_reference
        else:
            walltime = None
        tier, tier_source = self.tier(record)
        spec = JobSpec(
            id=record.id,
            team=self.team(record),
            tier=tier,
            gpus=record.gpus,
            duration_s=record.run_s * to_reference,
            submit_s=(record.submit_s - origin) * opts.time_scale,
            gpu_types=dict(record.gpu_types),
            walltime_s=walltime,
            gpu_milli=record.gpu_milli,
            user=record.user,
            command=record.command,
            checkpoint_interval_s=record.checkpoint_interval_s,
        )
        return spec, tier_source


def unit_hash(seed: int, salt: str, key: str) -> float:
    """A number in [0, 1) fixed by (seed, salt, key): stable across runs and Python versions."""
    digest = hashlib.blake2b(f"{seed}\0{salt}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def required_id(record: Mapping[str, Any], field_name: str) -> str:
    """A record's identifier, stripped; a missing or blank one is a bad row."""
    value = (record.get(field_name) or "").strip()
    if not value:
        raise BadField(field_name, "missing")
    return value


def gpu_count(record: Mapping[str, Any], field_name: str) -> int | Skip:
    """The GPUs a record asks for; a CPU-only record (0) is skipped, a negative one is bad."""
    gpus = as_int(record[field_name], field_name)
    if gpus < 0:
        raise BadField(field_name, f"must be >= 0, got {gpus}")
    return Skip("cpu_only") if gpus == 0 else gpus


def as_int(raw: str | None, field_name: str) -> int:
    """An integer field; "3.0" is accepted (some exports write integers as floats)."""
    if raw is not None:
        try:
            return int(raw)  # the common case; anything else gets the checks below
        except ValueError:
            pass
    value = as_float(raw, field_name)
    if value != int(value):
        raise BadField(field_name, f"not a whole number: {raw!r}")
    return int(value)


def as_float(raw: str | None, field_name: str) -> float:
    if raw is None or not raw.strip():
        raise BadField(field_name, "missing")
    try:
        value = float(raw)
    except ValueError:
        raise BadField(field_name, f"not a number: {raw!r}") from None
    if not math.isfinite(value):
        raise BadField(field_name, f"not a finite number: {raw!r}")
    return value


def as_time(raw: str | None, field_name: str) -> float:
    """Seconds from a number of seconds or an ISO date-time (naive ones are read as UTC)."""
    if raw is None or not raw.strip():
        raise BadField(field_name, "missing")
    try:
        return float(raw)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(raw.strip())
    except ValueError:
        raise BadField(field_name, f"not a time: {raw!r}") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def check_columns(path: Path, header: Iterable[str], required: Iterable[str]) -> None:
    """A file without the columns a format needs cannot be read at all, strict or not."""
    missing = [c for c in required if c not in set(header)]
    if missing:
        raise InvalidInput(f"{path}: missing columns {', '.join(missing)}")


def csv_rows(
    path: Path,
    report: Reporter,
    required: Iterable[str],
    columns: list[str] | None = None,
) -> Generator[tuple[int, dict[str, str]], None, None]:
    """Stream a CSV file as (line number, {column: value}).

    The header is the first line unless `columns` names the columns of a headerless file.
    Blank lines are ignored; a line with the wrong number of fields goes to `report` as a bad
    `columns` row. Undecodable bytes are replaced, so they surface as a bad field, not a crash.
    """
    with path.open(newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.reader(f)
        try:
            if columns is None:
                first = next(reader, None)
                if first is None:
                    raise InvalidInput(f"{path}: empty file, expected a header line")
                columns = [c.strip() for c in first]
            check_columns(path, columns, required)
            width = len(columns)
            for values in reader:
                if not values:
                    continue
                if len(values) != width:
                    report.bad(
                        reader.line_num, "columns", f"expected {width} fields, got {len(values)}"
                    )
                    continue
                yield reader.line_num, dict(zip(columns, values, strict=True))
        except csv.Error as exc:
            raise InvalidInput(f"{path}: row {reader.line_num}: unreadable CSV: {exc}") from None
