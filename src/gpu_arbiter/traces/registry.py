"""Trace formats by name, for the CLI and the simulator: `read_trace(path, fmt, options)`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from gpu_arbiter.domain import InvalidInput, JobSpec
from gpu_arbiter.traces.alibaba import AlibabaReader
from gpu_arbiter.traces.arbiter_history import ArbiterHistoryReader
from gpu_arbiter.traces.base import ReadStats, TraceOptions, TraceReader
from gpu_arbiter.traces.gavel import GavelReader
from gpu_arbiter.traces.helios import HeliosReader
from gpu_arbiter.traces.pai import PaiReader
from gpu_arbiter.traces.philly import PhillyReader
from gpu_arbiter.traces.tiresias import TiresiasReader

FORMATS: dict[str, TraceReader] = {
    reader.name: reader
    for reader in (
        AlibabaReader(),
        TiresiasReader(),
        GavelReader(),
        PhillyReader(),
        HeliosReader(),
        PaiReader(),
        ArbiterHistoryReader(),
    )
}


def read_trace(
    path: str | Path, fmt: str, options: TraceOptions | None = None
) -> tuple[Iterator[JobSpec], ReadStats]:
    """Jobs of the trace at `path` in format `fmt`, and the stats that fill as they are read.

    An unknown format, a missing file or an option naming a field the format lacks raise
    `InvalidInput` here, before any job is read.
    """
    reader = FORMATS.get(fmt)
    if reader is None:
        raise InvalidInput(f"unknown trace format {fmt!r}; known: {', '.join(sorted(FORMATS))}")
    stats = ReadStats(source=str(path))
    return reader.read(path, options, stats), stats
