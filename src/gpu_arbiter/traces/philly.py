"""Microsoft Philly traces (Jeon et al., ATC '19; github.com/msr-fiddle/philly-traces).

`cluster_job_log` is one JSON array of jobs: `jobid`, `user`, `vc`, `status` (Pass, Killed,
Failed), `submitted_time` and `attempts`, each with `start_time`, `end_time` and `detail`,
a list of `{ip, gpus: [...]}` per machine. Times are "YYYY-MM-DD HH:MM:SS" or None.

Mapping: GPUs = those of the first attempt that was placed; run time = the sum of the
attempts' run times (the GPU time the job held, without the queueing between retries);
submit = `submitted_time`; team = `vc`; tier from the mix (the trace has no priorities).
Skipped: jobs that never ran (`never_started`), whose last attempt has no end (`unfinished`:
still running when the log was cut), with no GPU (`cpu_only`) or no run time
(`zero_duration`). "Row" in messages is the job's 1-based position in the array.

GPU type: the trace gives only 12 GB and 24 GB GPU memories; we take run times as measured on
P100-class GPUs (`PHILLY_SOURCE_SPEED`), as other replays of this trace do.

The ~100k-job file is decoded one element at a time (`json.JSONDecoder.raw_decode` over
chunks), never loaded whole.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

from gpu_arbiter.domain import JobSpec
from gpu_arbiter.traces.base import (
    BadField,
    ReadStats,
    RecordPass,
    Reporter,
    Skip,
    TraceOptions,
    TraceReader,
    TraceRecord,
    as_time,
)
from gpu_arbiter.traces.hardware import P100

PHILLY_SOURCE_SPEED = P100.speed
_CHUNK = 1 << 16
# No Philly job record comes near this; a longer undecodable stretch is a broken file, not
# a record still being read.
_MAX_RECORD_CHARS = 8 << 20
_FIELDS = frozenset(("jobid", "user", "vc", "status"))


def json_array(path: Path, report: Reporter) -> Generator[tuple[int, Any], None, None]:
    """Stream the elements of a top-level JSON array as (1-based index, element).

    A broken element or a truncated file is reported as a bad `json` row, after which the rest
    of the file cannot be resynchronised and reading stops.
    """
    decoder = json.JSONDecoder()
    with path.open(encoding="utf-8", errors="replace") as f:
        buf = ""
        pos = 0
        eof = False
        index = 0
        expect_open = True

        def fill() -> bool:
            nonlocal buf, pos, eof
            chunk = f.read(_CHUNK)
            buf = buf[pos:] + chunk
            pos = 0
            eof = not chunk
            return bool(chunk)

        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n":
                pos += 1
            if pos == len(buf):
                if eof or not fill():
                    problem = "empty file" if expect_open else "file ends inside the array"
                    report.bad(index + 1, "json", problem)
                    return
                continue
            if expect_open:
                if buf[pos] != "[":
                    report.bad(1, "json", "file is not a JSON array")
                    return
                pos += 1
                expect_open = False
                continue
            if buf[pos] == "]":
                return
            if buf[pos] == "," and index:
                pos += 1
                continue
            try:
                element, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as exc:
                if not eof and len(buf) - pos < _MAX_RECORD_CHARS and fill():
                    continue
                report.bad(index + 1, "json", f"undecodable element: {exc.msg}")
                return
            if end == len(buf) and not eof and fill():
                continue  # a number or literal may go on in the next chunk: decode it whole
            index += 1
            pos = end
            yield index, element


class PhillyReader(TraceReader):
    name = "philly"
    fields = _FIELDS
    team_field = "vc"

    def records(self, path: Path, report: Reporter, options: TraceOptions) -> RecordPass:
        return lambda rep: json_array(path, rep)

    def parse(self, row: int, record: Any) -> TraceRecord | Skip:
        if not isinstance(record, dict):
            raise BadField("job", "not a JSON object")
        jobid = _text(record, "jobid")
        if not jobid:
            raise BadField("jobid", "missing")
        attempts = record.get("attempts") or []
        if not isinstance(attempts, list):
            raise BadField("attempts", "not a list")
        if not attempts:
            return Skip("never_started")
        gpus = next((n for n in map(_gpus, attempts) if n), 0)
        run_s = 0.0
        started = False
        for k, attempt in enumerate(attempts):
            start, end = _time(attempt, "start_time"), _time(attempt, "end_time")
            if end is None and k == len(attempts) - 1 and start is not None:
                return Skip("unfinished")
            if start is not None and end is not None:
                if end < start:
                    raise BadField("end_time", f"attempt {k + 1} ends before it starts")
                run_s += end - start
                started = True
        if not started:
            return Skip("never_started")
        if gpus == 0:
            return Skip("cpu_only")
        if run_s == 0:
            return Skip("zero_duration")
        submitted = _time(record, "submitted_time")
        if submitted is None:
            raise BadField("submitted_time", "missing")
        return TraceRecord(
            id=jobid,
            submit_s=submitted,
            run_s=run_s,
            gpus=gpus,
            source_speed=PHILLY_SOURCE_SPEED,
            fields={name: _text(record, name) for name in _FIELDS},
            user=_text(record, "user") or None,
        )


def _text(record: dict[str, Any], name: str) -> str:
    value = record.get(name)
    return "" if value is None else str(value)


def _time(record: Any, name: str) -> float | None:
    if not isinstance(record, dict):
        raise BadField("attempts", "an attempt is not a JSON object")
    value = record.get(name)
    if value is None or value == "None" or value == "":
        return None
    return as_time(str(value), name)


def _gpus(attempt: Any) -> int:
    detail = attempt.get("detail") if isinstance(attempt, dict) else None
    if not isinstance(detail, list) or not all(
        isinstance(d, dict) and isinstance(d.get("gpus", []), list) for d in detail
    ):
        raise BadField("detail", "expected a list of {ip, gpus: [...]}")
    return sum(len(d.get("gpus", [])) for d in detail)


_READER = PhillyReader()


def read_philly(
    path: str | Path, options: TraceOptions | None = None, stats: ReadStats | None = None
) -> Iterator[JobSpec]:
    """Stream the jobs of a Philly `cluster_job_log`."""
    return _READER.read(path, options, stats)
