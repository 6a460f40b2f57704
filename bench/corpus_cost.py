"""What the corpus evaluation (`bench.corpus`) costs: each run's estimate, the order runs go to
the workers in, the ETA while they run and where the time went.

A run's estimate is what the same replay (the same cache file name: a digest of its inputs)
cost under any earlier version of the simulating code, whose results lie in sibling folders of
the cache; code changes move a replay's cost far less than its inputs do (a 2,000-job saturated
trace against a 4-job one). A run never measured before is estimated from its trace file's size
at the CPU seconds per byte that measured runs of the same family and policy took, else of the
same policy, else of every run. Runs go to the workers longest first, so the last ones to end
are short and the workers end together.
"""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path


def family(trace: str) -> str:
    """The family a corpus trace belongs to: its source and the kind of file, without the
    cluster, seed folder or share (`tiresias/yarn-gput10000@cluster_spec` -> `tiresias/yarn-gput`,
    `gavel/msr/seed=3/6214e9` -> `gavel/msr`, `alibaba/gpushare40` -> `alibaba/gpushare`)."""
    source, _, rest = trace.partition("/")
    kind = rest.split("/")[0].split("@")[0]
    return f"{source}/{re.sub(r'[0-9.]+$', '', kind) or kind}"


def run_cost(result: Mapping[str, object]) -> float:
    """A cached run's cost in CPU seconds (runs cached before CPU time was kept: wall time)."""
    return float(result.get("cpu_s", result.get("wall_s", 0.0)))  # type: ignore[arg-type]


def prior_costs(current: Path) -> dict[str, float]:
    """Each run measured under another code version, by its cache file name: its cost there
    (the newest measurement where several versions have it)."""
    found: dict[str, tuple[float, float]] = {}
    if not current.parent.is_dir():
        return {}
    for folder in current.parent.iterdir():
        if folder == current or not folder.is_dir():
            continue
        for path in folder.glob("*.json"):
            try:
                cost, mtime = run_cost(json.loads(path.read_text())), path.stat().st_mtime
            except (OSError, ValueError):
                continue
            if path.name not in found or mtime > found[path.name][1]:
                found[path.name] = (cost, mtime)
    return {name: cost for name, (cost, _) in found.items()}


def estimate(todo: Sequence[tuple[str, str, int, str]], priors: Mapping[str, float]) -> list[float]:
    """Each run's estimated CPU seconds; a run is (trace name, policy, trace file size, cache
    file name)."""
    per_byte: dict[tuple[str, ...], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for trace, policy, size, name in todo:
        if name in priors:
            for key in ((family(trace), policy), (policy,), ()):
                per_byte[key][0] += priors[name]
                per_byte[key][1] += max(size, 1)
    out = []
    for trace, policy, size, name in todo:
        if name in priors:
            out.append(priors[name])
            continue
        for key in ((family(trace), policy), (policy,), ()):
            if key in per_byte and per_byte[key][1] > 0:
                out.append(per_byte[key][0] / per_byte[key][1] * max(size, 1))
                break
        else:
            out.append(float(max(size, 1)))  # nothing measured: sizes only order the runs
    return out


class Eta:
    """Progress by estimated work, not by run count: the share of the estimated CPU seconds
    done so far and the time it took give the rate, and the rate the time left. `say` gets a
    line at the start and then at most every `every_s` seconds."""

    def __init__(
        self,
        estimates: Sequence[float],
        workers: int,
        say: Callable[[str], None],
        measured: bool = True,
        every_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = sum(estimates)
        self.runs = len(estimates)
        self.done = 0.0
        self.ended = 0
        self.say = say
        self.every_s = every_s
        self.clock = clock
        self.start = self.last = clock()
        if measured:
            say(
                f"{self.runs} runs to do, estimated {self.total / 60:.0f} CPU-minutes: about "
                f"{self.total / 60 / max(1, min(workers, self.runs)):.0f} min on {workers} "
                "worker processes"
            )
        else:
            say(f"{self.runs} runs to do, none measured before: the ETA follows as they end")

    def ended_one(self, estimated: float) -> None:
        self.done += estimated
        self.ended += 1
        now = self.clock()
        if now - self.last >= self.every_s or self.ended == self.runs:
            self.last = now
            self.say(self.line(now))

    def line(self, now: float) -> str:
        elapsed = now - self.start
        share = self.done / self.total if self.total > 0 else 1.0
        head = (
            f"{self.ended}/{self.runs} runs, {share:.0%} of the estimated work, "
            f"{elapsed / 60:.0f} min"
        )
        if self.ended == self.runs or share <= 0:
            return head
        left = elapsed * (1 - share) / share
        at = (datetime.now(UTC) + timedelta(seconds=left)).strftime("%H:%M UTC")
        return f"{head}; ETA {at} (about {left / 60:.0f} min left)"


def cost_by_family(
    runs: Iterable[tuple[str, str, Mapping[str, object]]], policies: Sequence[str]
) -> tuple[list[str], list[list[str]]]:
    """Header and cells of a table of CPU-minutes per trace family and policy, with the share of
    the whole each family took; a run is (trace name, policy, its cached result)."""
    minutes: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(policies, 0.0))
    traces: dict[str, set[str]] = defaultdict(set)
    for trace, policy, result in runs:
        minutes[family(trace)][policy] += run_cost(result) / 60
        traces[family(trace)].add(trace)
    whole = sum(sum(m.values()) for m in minutes.values()) or 1.0
    header = ["family", "traces", *policies, "all", "share"]
    cells = [
        [
            fam,
            str(len(traces[fam])),
            *(f"{m[p]:.1f}" for p in policies),
            f"{sum(m.values()):.1f}",
            f"{sum(m.values()) / whole:.0%}",
        ]
        for fam, m in sorted(minutes.items(), key=lambda fm: -sum(fm[1].values()))
    ]
    return header, cells
