"""`make bench-corpus`: every policy on every trace we have, in two settings, judged by issue 49.

    python -m bench.corpus [--root ../shared/traces] [--traces GLOB,...] [--seeds 0-3]
                           [--policies fifo,backfill,...] [--settings mechanics,tiers]
                           [--jobs N] [--results bench/results/corpus]
                           [--doc docs/results/corpus.md] [--baselines-from REV]

The trace sweep (`bench.trace_sweep`) judges one folder of one format; this replays the whole
corpus under ROOT (`corpus`: Tiresias' 60_job on each of its cluster files, traces built from
its yarn-gput duration samples, every Gavel trace, every Alibaba v2023 pod list: those without
times take them from `openb_pod_list_default.csv`, by name or drawn by GPU count, see
`gpu_arbiter.traces.alibaba`), each trace at the cluster and arrival scale the per-format
benchmarks use, under every policy and seed, in two settings (`SETTINGS`):

- *mechanics*: every job at tier 3 (the trace's own tier field ignored, `--tier-mix 0,0,1`),
  so one scheduler meets another with nothing to honour;
- *tiers*: tiers as `arbiter bench` draws them (the format's tier field, else the default mix).

Per trace it gives the ratio of Arbiter's value to the best baseline's (means over the seeds)
on mean JCT and, in the tiers setting, on tier-1 P99 queueing and tier-1 mean JCT; then per
setting the win/tie/loss counts, the geometric mean of the mean-JCT ratio and the issue's goals
(`GOALS`), each PASS or FAIL. It writes the record, `--doc` (tables, a plot beside it, the
command and the commit), which is generated and not to be edited by hand.

Each (trace, setting, policy, seed) replay is one task for the worker processes (`--jobs`). Its
KPIs are kept under `--results`/CODE/ (CODE: a digest of the simulating code's git trees,
`SIMULATING`, and of any uncommitted change to it), in a file named by a digest of its inputs
(the bytes of the files it reads, `trace_digest`; format, cluster, arrival scale, how tiers
are read, policy, seed), so an interrupted run picks up where it stopped and a subset
run reuses what a larger one measured. Each result also keeps its run's name and CPU time;
runs go to the workers longest first by what they cost under earlier code, the tool prints an
ETA as they end, and the record ends with the CPU time by trace family and policy
(`bench.corpus_cost`).

The baselines cost most of a run, and a change to Arbiter's rules does not change what they
decide: `--baselines-from REV[,REV...]` reads their runs from the caches of those commits where this
code has none, and is refused unless every baseline's decision digest (`bench/digests.json`) is
the same at each REV as here; the record says how many runs came from there.
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import hashlib
import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from bench.corpus_cost import Eta, cost_by_family, estimate, prior_costs, run_cost
from bench.digests import DIGESTS
from bench.trace_sweep import (
    ALIBABA_ARRIVAL_SCALE,
    ALIBABA_CLUSTER,
    MEASURES,
    judge,
    measure,
)
from gpu_arbiter.cli.bench import DEFAULT_GAVEL_CLUSTER, parse_policies
from gpu_arbiter.cli.inputs import load_inputs, trace_options
from gpu_arbiter.domain import InvalidInput
from gpu_arbiter.engine.policies import POLICIES
from gpu_arbiter.sim.report import ties
from gpu_arbiter.traces.alibaba import times_source
from gpu_arbiter.traces.base import MIX, TraceOptions
from gpu_arbiter.traces.tiresias import tiresias_cluster

REPO = Path(__file__).resolve().parent.parent
ROOT = Path("../shared/traces")  # from the repository root, as in the Makefile
RESULTS = REPO / "bench" / "results" / "corpus"
DOC = REPO / "docs" / "results" / "corpus.md"
DEFAULT_SEEDS = (0, 1, 2, 3)
OURS = "arbiter"

SETTINGS: dict[str, TraceOptions] = {
    "mechanics": trace_options(tier_field=MIX, tier_mix="0,0,1"),
    "tiers": trace_options(),
}
JCT, T1_P99, T1_JCT = (m.key for m in MEASURES)
# Which KPIs each setting judges: tier 1 is empty in the mechanics setting.
JUDGED = {"mechanics": (JCT,), "tiers": (JCT, T1_P99, T1_JCT)}
MECHANICS_GEOMEAN = 0.97  # issue 49: geometric mean of the mean-JCT ratio at most this
MECHANICS_WORST = 1.05  # ... and no trace's ratio above this
TIERS_SHARE = 0.90  # tier-1 KPIs no worse than the best baseline on at least this share
TIERS_GEOMEAN = 1.05  # ... and the mean-JCT geometric mean at most this

# Tiresias' yarn-gput files are sorted samples of jobs' GPU time (GPU-seconds) from a
# production YARN cluster, not traces. A trace is built from each (`build_yarn`): every sample
# once, in a seeded random order; a GPU count drawn from 60_job's counts; run time = GPU time /
# GPUs; Poisson arrivals offering `YARN_LOAD` of the cluster_spec cluster (64 GPUs).
YARN_BUILD_SEED = 0
YARN_LOAD = 0.8
YARN_CLUSTER_FILE = "cluster_spec.csv"
TIRESIAS_JOBS = "60_job.csv"


@dataclass(frozen=True, slots=True)
class Entry:
    """One trace of the corpus and the setting it replays at."""

    name: str
    path: Path
    fmt: str
    cluster: str
    arrival_scale: float = 1.0


def _is_cluster_file(path: Path) -> bool:
    with path.open(encoding="utf-8") as f:
        return f.readline().startswith("num_switch,")


def build_yarn(samples: Path, jobs_file: Path, cluster_file: Path, out: Path) -> Path:
    """A Tiresias job CSV built from a yarn-gput sample file (see `YARN_LOAD`), written to
    OUT/<name>.csv; the same inputs always give the same file."""
    with samples.open(newline="", encoding="utf-8") as f:
        gpu_time = np.array([float(r["duration"]) for r in csv.DictReader(f)])
    with jobs_file.open(newline="", encoding="utf-8") as f:
        counts = np.array([int(r["num_gpu"]) for r in csv.DictReader(f)])
    if gpu_time.size == 0 or counts.size == 0:
        raise InvalidInput(f"{samples} or {jobs_file}: no rows to build a trace from")
    capacity = sum(tiresias_cluster(cluster_file).gpus_by_type().values())
    rng = np.random.default_rng(YARN_BUILD_SEED)
    gpu_time = rng.permutation(gpu_time)
    gpus = rng.choice(counts, size=gpu_time.size)
    run_s = np.maximum(1.0, np.rint(gpu_time / gpus))
    mean_gap = gpu_time.mean() / (capacity * YARN_LOAD)
    gaps = rng.exponential(mean_gap, size=gpu_time.size)
    gaps[0] = 0.0
    submit = np.rint(np.cumsum(gaps))
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{samples.stem}.csv"
    rows = ["job_id,num_gpu,submit_time,duration"]
    rows += [
        f"{i},{g},{s:.0f},{d:.0f}"
        for i, (g, s, d) in enumerate(zip(gpus, submit, run_s, strict=True))
    ]
    path.write_text("\n".join(rows) + "\n")
    return path


def corpus(root: Path, built: Path) -> list[Entry]:
    """Every trace under ROOT, each at its format's benchmark setting: Tiresias on its own
    cluster files, Gavel on `DEFAULT_GAVEL_CLUSTER` (as `make bench-traces`), Alibaba pod
    lists as `make bench-alibaba`. Yarn-gput traces are built into BUILT."""
    entries: list[Entry] = []
    tiresias = root / "tiresias"
    if tiresias.is_dir():
        clusters = [p for p in sorted(tiresias.glob("*.csv")) if _is_cluster_file(p)]
        jobs = tiresias / TIRESIAS_JOBS
        if jobs.is_file():
            for spec in clusters:
                entries.append(
                    Entry(f"tiresias/{jobs.stem}@{spec.stem}", jobs, "tiresias", f"tiresias:{spec}")
                )
            spec = tiresias / YARN_CLUSTER_FILE
            for samples in sorted(tiresias.glob("yarn-gput*.csv")):
                path = build_yarn(samples, jobs, spec, built)
                name = f"tiresias/{samples.stem}@{spec.stem}"
                entries.append(Entry(name, path, "tiresias", f"tiresias:{spec}"))
    for path in sorted((root / "gavel").rglob("*.trace")):
        name = "gavel/" + str(path.relative_to(root / "gavel").with_suffix(""))
        entries.append(Entry(name.replace("/traces/", "/"), path, "gavel", DEFAULT_GAVEL_CLUSTER))
    for path in sorted((root / "alibaba-gpu-v2023").rglob("openb_pod_list_*.csv")):
        name = "alibaba/" + path.stem.removeprefix("openb_pod_list_")
        entries.append(Entry(name, path, "alibaba-v2023", ALIBABA_CLUSTER, ALIBABA_ARRIVAL_SCALE))
    return entries


def select(entries: list[Entry], globs: str) -> list[Entry]:
    """The entries whose name matches one of the comma-separated globs."""
    patterns = [g.strip() for g in globs.split(",") if g.strip()]
    chosen = [e for e in entries if any(fnmatch.fnmatchcase(e.name, g) for g in patterns)]
    if not chosen:
        raise InvalidInput(f"--traces {globs!r}: matches none of the {len(entries)} traces")
    return chosen


def parse_seeds(text: str) -> list[int]:
    """`0-3` or `0,2,5` → the seeds, in order, each once."""
    seeds: list[int] = []
    try:
        for part in (p.strip() for p in text.split(",") if p.strip()):
            first, dash, last = part.partition("-")
            seeds += list(range(int(first), int(last) + 1)) if dash else [int(part)]
    except ValueError:
        raise InvalidInput(f"--seeds {text!r}: expected 0-3 or 0,1,2") from None
    if not seeds:
        raise InvalidInput(f"--seeds {text!r}: give at least one seed")
    return list(dict.fromkeys(seeds))


# What a replay's result depends on besides its inputs: the simulator and engine, the sweep's
# replay and the pinned dependencies. This module's tables and plots are not among them, so
# changing them reuses every cached run.
SIMULATING = ("src", "bench/trace_sweep.py", "pyproject.toml")


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()


def head_commit() -> str:
    return _git("rev-parse", "--short=12", "HEAD")


def committed_code(rev: str = "HEAD") -> str:
    """A digest of the simulating code as committed at `rev` (its git trees, so that a rebase
    or a commit elsewhere keeps the cache)."""
    trees = _git("rev-parse", *(f"{rev}:{path}" for path in SIMULATING))
    return hashlib.sha256(trees.encode()).hexdigest()[:12]


def code_version() -> str:
    """The committed simulating code's digest plus one of its uncommitted changes: runs are
    cached under it."""
    commit = committed_code()
    status = _git("status", "--porcelain", "--", *SIMULATING)
    if not status:
        return commit
    changed = status + _git("diff", "HEAD", "--", *SIMULATING)
    for line in status.splitlines():  # untracked files count by their contents
        if line.startswith("??") and (REPO / line[3:]).is_file():
            changed += (REPO / line[3:]).read_text(errors="replace")
    return f"{commit}-dirty-{hashlib.sha256(changed.encode()).hexdigest()[:8]}"


@dataclass(frozen=True, slots=True)
class Task:
    entry: Entry
    setting: str
    policy: str
    seed: int


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def trace_digest(entry: Entry) -> str:
    """A digest of the files a replay of `entry` reads: the trace's, and for an Alibaba pod list
    without times also the default list's it takes them from."""
    digest = file_digest(entry.path)
    try:
        source = times_source(entry.path) if entry.fmt == "alibaba-v2023" else None
    except InvalidInput:
        source = None  # the replay records why it cannot run
    if source is None:
        return digest
    return hashlib.sha256((digest + file_digest(source)).encode()).hexdigest()


def changed_baselines(rev: str) -> list[str]:
    """The decision digests (`bench.digests`) of the baselines, every policy but Arbiter, that
    differ between `rev` and this code: none, and their runs at `rev` stand for runs at this
    code. The digests cover whole decision streams of synthetic, Gavel and Alibaba runs, with
    failures, and tests/engine/test_digests.py holds the committed file to the code."""
    then = json.loads(_git("show", f"{rev}:bench/digests.json"))
    now = json.loads(DIGESTS.read_text())
    keys = {k for k in {*then, *now} if k.rsplit("/", 1)[-1] != OURS}
    return sorted(k for k in keys if then.get(k) != now.get(k))


def baselines_code(rev: str) -> str:
    """The cache folder of commit `rev`, for its baselines' runs; InvalidInput when `rev` is no
    commit or a baseline decides differently there."""
    try:
        _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    except subprocess.CalledProcessError:
        raise InvalidInput(f"--baselines-from {rev!r}: no such commit") from None
    changed = changed_baselines(rev)
    if changed:
        raise InvalidInput(
            f"--baselines-from {rev}: baseline decisions differ since then ({', '.join(changed)})"
        )
    return committed_code(rev)


def cache_path(results: Path, task: Task, trace_digest: str) -> Path:
    key = {
        "trace": trace_digest,
        "fmt": task.entry.fmt,
        "cluster": task.entry.cluster,
        "arrival_scale": task.entry.arrival_scale,
        "reading": repr(SETTINGS[task.setting]),
        "policy": task.policy,
        "seed": task.seed,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return results / f"{digest}.json"


def run_task(task: Task) -> dict[str, object]:
    """One replay: {"task", "jobs", "kpis", "cpu_s", "wall_s"}, or "error" in place of "jobs"
    and "kpis" when the trace cannot run on its cluster (a job larger than any node, an
    unreadable file). "task" names the run, so the cache can be read without the corpus."""
    start, cpu = time.perf_counter(), time.process_time()
    e = task.entry
    try:
        inputs = load_inputs(
            e.cluster,
            trace=e.path,
            fmt=e.fmt,
            seed=task.seed,
            reading=SETTINGS[task.setting],
            arrival_scale=e.arrival_scale,
        )
        out: dict[str, object] = {
            "jobs": len(inputs.jobs),
            "kpis": measure(inputs, task.policy, task.seed),
        }
    except InvalidInput as err:
        out = {"error": str(err)}
    named = {"trace": e.name, "setting": task.setting, "policy": task.policy, "seed": task.seed}
    return {
        "task": named,
        **out,
        "cpu_s": round(time.process_time() - cpu, 3),
        "wall_s": round(time.perf_counter() - start, 3),
    }


Runs = dict[tuple[str, str, str, int], dict]  # (trace, setting, policy, seed) -> run_task's


def run_all(
    tasks: list[Task],
    results: Path,
    jobs: int,
    console: Console | None = None,
    baselines: Iterable[Path] = (),
) -> Runs:
    """Every task's result, from the cache where it is there (for a baseline, else from the
    first of the caches `baselines` of other code versions whose baselines decide the same
    that has it; such a run is marked "reused"), else run by `jobs` worker processes and kept
    in the cache as each one ends."""
    results.mkdir(parents=True, exist_ok=True)
    digests = {e.path: trace_digest(e) for e in {t.entry for t in tasks}}
    runs: Runs = {}
    todo: list[tuple[Task, Path]] = []
    for t in tasks:
        path = cache_path(results, t, digests[t.entry.path])
        older = [cache_path(b, t, digests[t.entry.path]) for b in baselines]
        there = next((p for p in older if p.is_file()), None) if t.policy != OURS else None
        key = (t.entry.name, t.setting, t.policy, t.seed)
        if path.is_file():
            runs[key] = json.loads(path.read_text())
        elif there is not None:
            runs[key] = {**json.loads(there.read_text()), "reused": True}
        else:
            todo.append((t, path))
    if console is not None:
        reused = sum(1 for r in runs.values() if r.get("reused"))
        from_there = f" ({reused} baseline runs from earlier commits' caches)" if reused else ""
        console.print(f"{len(tasks) - len(todo)} of {len(tasks)} runs cached{from_there}")
    if not todo:
        return runs
    priors = prior_costs(results)
    costs = estimate(
        [(t.entry.name, t.policy, t.entry.path.stat().st_size, p.name) for t, p in todo], priors
    )
    order = sorted(range(len(todo)), key=lambda i: -costs[i])  # longest first (corpus_cost)
    say = console.print if console is not None else (lambda line: None)
    eta = Eta(costs, jobs, say, measured=any(p.name in priors for _, p in todo))
    with ProcessPoolExecutor(max(1, jobs)) as pool:
        futures = {pool.submit(run_task, todo[i][0]): i for i in order}
        for future in as_completed(futures):
            i = futures[future]
            (t, path), result = todo[i], future.result()
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(result) + "\n")
            tmp.replace(path)  # a run cut off mid-write leaves no half a result behind
            runs[(t.entry.name, t.setting, t.policy, t.seed)] = result
            eta.ended_one(costs[i])
    return runs


def ratio(ours: float, best: float) -> float:
    """Arbiter's value over the best baseline's: 1 when they tie (both 0 included), infinite
    when the baseline has 0 and Arbiter does not."""
    if ties(ours, best):
        return 1.0
    return ours / best if best > 0 else math.inf


@dataclass(slots=True)
class Row:
    """One trace in one setting: each policy's KPIs (means over the seeds), or why it could
    not run."""

    trace: str
    jobs: int = 0
    error: str | None = None
    policies: dict[str, dict[str, float]] = field(default_factory=dict)

    def judged(self, key: str) -> tuple[str, float, str, float, float] | None:
        """(verdict, Arbiter's value, best baseline, its value, ratio) on one KPI, or None."""
        if self.error is not None:
            return None
        j = judge({"policies": self.policies}, key)
        if j is None:
            return None
        v, ours, baseline, best = j
        return v, ours, baseline, best, ratio(ours, best)


def rows_for(
    runs: Runs, traces: Iterable[str], setting: str, policies: list[str], seeds: list[int]
) -> list[Row]:
    rows = []
    for trace in traces:
        row = Row(trace)
        for policy in policies:
            got = [runs[(trace, setting, policy, s)] for s in seeds]
            errors = [str(r["error"]) for r in got if "error" in r]
            if errors:
                row.error = errors[0]
                break
            row.jobs = int(got[0]["jobs"])
            row.policies[policy] = {
                m.key: float(np.mean([r["kpis"][m.key] for r in got])) for m in MEASURES
            }
        rows.append(row)
    return rows


@dataclass(slots=True)
class Verdict:
    """A setting's summary: win/tie/loss per KPI, the mean-JCT geometric mean and the goals."""

    setting: str
    judged: int
    tally: dict[str, dict[str, int]]
    geomean: float
    worst: tuple[float, str] | None
    goals: list[tuple[str, bool]]


def geomean(values: list[float]) -> float:
    if not values:
        return math.nan
    if any(math.isinf(v) for v in values):
        return math.inf
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summarise(setting: str, rows: list[Row]) -> Verdict:
    """Counts, geometric mean and issue 49's goals for one setting's rows (rows that could not
    run, or lack Arbiter or a baseline, are left out and do not count)."""
    judged = [r for r in rows if r.judged(JCT) is not None]
    tally = {}
    for key in JUDGED[setting]:
        counts = {"WIN": 0, "TIE": 0, "LOSS": 0}
        for r in judged:
            counts[r.judged(key)[0]] += 1
        tally[key] = counts
    ratios = [(r.judged(JCT)[4], r.trace) for r in judged]
    geo = geomean([x for x, _ in ratios])
    worst = max(ratios) if ratios else None
    any_judged = bool(judged)
    if setting == "mechanics":
        goals = [
            (
                f"geometric mean of the mean-JCT ratio <= {MECHANICS_GEOMEAN:g}",
                any_judged and geo <= MECHANICS_GEOMEAN,
            ),
            (
                f"no trace's mean-JCT ratio above {MECHANICS_WORST:g}",
                any_judged and worst[0] <= MECHANICS_WORST,
            ),
        ]
    else:
        no_worse = sum(1 for r in judged if all(r.judged(k)[0] != "LOSS" for k in (T1_JCT, T1_P99)))
        share = no_worse / len(judged) if judged else 0.0
        goals = [
            (
                f"tier-1 mean JCT and P99 queueing no worse than the best baseline on >= "
                f"{TIERS_SHARE:.0%} of traces ({no_worse} of {len(judged)}, {share:.0%})",
                any_judged and share >= TIERS_SHARE,
            ),
            (
                f"geometric mean of the mean-JCT ratio <= {TIERS_GEOMEAN:g}",
                any_judged and geo <= TIERS_GEOMEAN,
            ),
        ]
    return Verdict(setting, len(judged), tally, geo, worst, goals)


PLOT_CLIP = 2.0
LABELS = {m.key: m.label for m in MEASURES}
UNITS = {m.key: m.unit for m in MEASURES}


def _num(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.3f}"


def ratio_text(x: float) -> str:
    """A ratio (`ratio`) as the tables print it: to three decimals, or to as many more as it
    takes for a ratio that is no tie not to read 1 (values tie only when equal to a millionth,
    `ties`, so a 0.02 % win is a win and shows as 0.9998)."""
    if math.isinf(x) or x == 1.0:
        return _num(x)
    digits = 3
    while float(f"{x:.{digits}f}") == 1.0:
        digits += 1
    return f"{x:.{digits}f}"


def table(setting: str, rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    """Header and cells of a setting's per-trace table."""
    header = ["trace", "jobs"]
    for key in JUDGED[setting]:
        header += [f"{LABELS[key]} ratio", "Arbiter vs best"]
    cells = []
    for r in rows:
        if r.error is not None:
            cells.append([r.trace, "-", "could not run: " + r.error] + [""] * (len(header) - 3))
            continue
        line = [r.trace, str(r.jobs)]
        for key in JUDGED[setting]:
            j = r.judged(key)
            if j is None:
                line += ["", ""]
                continue
            v, ours, baseline, best, x = j
            unit = UNITS[key]
            line += [f"{ratio_text(x)} {v}", f"{ours:.3f} {unit} vs {baseline} {best:.3f} {unit}"]
        cells.append(line)
    return header, cells


def summary_lines(v: Verdict) -> list[str]:
    lines = [f"{v.judged} traces judged"]
    for key, c in v.tally.items():
        lines.append(f"{LABELS[key]}: {c['WIN']} wins, {c['TIE']} ties, {c['LOSS']} losses")
    worst = f" (worst {_num(v.worst[0])}, {v.worst[1]})" if v.worst else ""
    lines.append(f"geometric mean of the mean-JCT ratio: {_num(v.geomean)}{worst}")
    lines += [f"{'PASS' if ok else 'FAIL'}: {text}" for text, ok in v.goals]
    return lines


def plot(settings: Mapping[str, list[Row]], path: Path) -> None:
    """Mean-JCT ratio per trace, a panel per setting (the goals' bounds dashed, ratios above
    `PLOT_CLIP` drawn at it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = [r.trace for r in next(iter(settings.values()))]
    fig, axes = plt.subplots(
        1, len(settings), figsize=(5 * len(settings), 1.5 + 0.16 * len(traces)), sharey=True
    )
    axes = np.atleast_1d(axes)
    y = np.arange(len(traces))
    for ax, (setting, rows) in zip(axes, settings.items(), strict=True):
        values = [(r.judged(JCT) or (None,) * 5)[4] for r in rows]
        shown = [np.nan if v is None else min(v, PLOT_CLIP) for v in values]
        colours = ["tab:green" if v is not None and v <= 1 else "tab:red" for v in values]
        ax.barh(y, np.array(shown) - 1, left=1, color=colours)
        ax.axvline(1, color="black", lw=0.8)
        bounds = (
            (MECHANICS_GEOMEAN, MECHANICS_WORST) if setting == "mechanics" else (TIERS_GEOMEAN,)
        )
        for b in bounds:
            ax.axvline(b, color="grey", ls="--", lw=0.8)
        ax.set_xlim(
            min(0.8, np.nanmin(shown, initial=1.0) - 0.02),
            max(1.1, np.nanmax(shown, initial=1.0) + 0.02),
        )
        ax.set_title(f"{setting}: Arbiter mean JCT / best baseline")
    axes[0].set_yticks(y, traces, fontsize=7)
    axes[0].invert_yaxis()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def markdown(
    meta: Mapping[str, object], settings: Mapping[str, list[Row]], plot_name: str | None
) -> str:
    out = [
        "# Arbiter against the best baseline on every trace (issue 49)",
        "",
        "Generated by `make bench-corpus`; do not edit by hand. Command: "
        f"`{meta['command']}`, at commit `{meta['commit']}` (simulating code "
        f"`{meta['code']}`, the cache folder), {meta['date']}.",
        "",
    ]
    if meta.get("reused"):
        out += [
            f"**Baselines from an earlier commit.** {meta['reused']} of the "
            f"{meta['baseline_runs']} "
            f"baseline runs were read from the caches of commits `{meta['baselines_from']}` "
            f"(simulating code `{meta['baselines_code']}`): every baseline's decision digest "
            "(`bench/digests.json`: whole decision streams of synthetic, Gavel and Alibaba "
            "runs with failures) is the same there as at this commit, so they decide as this "
            "code does. Arbiter's runs are all simulated at this commit.",
            "",
        ]
    if not meta["full"]:
        out += [
            f"**Partial run.** It covers {len(meta['traces'])} of the corpus's "
            f"{meta['corpus_size']} traces (`--traces {meta['globs']}`), seeds "
            f"{', '.join(map(str, meta['seeds']))}, policies {', '.join(meta['policies'])}, "
            f"settings {', '.join(settings)}. The goals below are judged on these traces "
            "only; `make bench-corpus` runs the whole corpus.",
            "",
        ]
    out += [
        "Each trace replays under each policy and seed; a KPI is the mean over the seeds, and a "
        "ratio is Arbiter's over the best baseline's on that KPI (below 1: Arbiter is better; "
        "1: a tie, the two equal to a millionth, and a ratio that is no tie shows as many "
        "decimals as it takes to differ from 1; `inf`: the baseline has 0). Settings: "
        "*mechanics*, every job at tier 3 (`--tier-field mix --tier-mix 0,0,1`); *tiers*, "
        "tiers as `arbiter bench` reads them (the format's tier field, else drawn 15/35/50 %). "
        "Failures are on at SPEC F3's rates, as in `arbiter bench`.",
        "",
        "Clusters: Tiresias' 60_job on each of its cluster files; Gavel traces on "
        f"`{DEFAULT_GAVEL_CLUSTER}` (as `make bench-traces`); Alibaba pod lists on "
        f"`{ALIBABA_CLUSTER}` with arrivals x{ALIBABA_ARRIVAL_SCALE:g} (as `make bench-alibaba`). "
        "The yarn-gput files are samples of jobs' GPU time, not traces; each is built into one "
        f"(seed {YARN_BUILD_SEED}): every sample once in random order, a GPU count drawn from "
        "60_job's counts, run time = GPU time / GPUs, Poisson arrivals offering "
        f"{YARN_LOAD:.0%} of the {YARN_CLUSTER_FILE} cluster (64 GPUs), on which it runs. "
        "Of the Alibaba pod lists, `default` and the nine `cpu*` lists hold the same GPU pods "
        "(they differ in CPU-only pods, which are no GPU jobs and are not read), so their rows "
        "differ only in the teams drawn for the pods. The `multigpu*` lists have no QoS or "
        "times: their pods take them by name from `default`, which they were sampled from, and "
        "the multi-GPU pods they add draw them (seeded by the run's seed) from `default`'s pods "
        "of the same GPU count.",
        "",
        "How the `gavel` baseline compares with the real Gavel simulator: "
        "[gavel-crosscheck.md](gavel-crosscheck.md).",
        "",
    ]
    if plot_name:
        out += [f"![mean-JCT ratio per trace]({plot_name})", ""]
    for setting, rows in settings.items():
        out += [f"## {setting}", ""]
        out += [f"- {line}" for line in summary_lines(summarise(setting, rows))]
        header, cells = table(setting, rows)
        out += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(c.replace("|", "/") for c in line) + " |" for line in cells]
        out.append("")
    header, cells = meta["cost"]
    out += [
        "## What the run cost",
        "",
        f"Simulation time: {meta['cpu_s'] / 60:.1f} CPU-minutes over {meta['runs']} runs "
        f"({meta['jobs']} worker processes). CPU-minutes by trace family and policy (runs "
        "cached before CPU time was kept count their wall time):",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(line) + " |" for line in cells),
    ]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the shared traces folder")
    parser.add_argument("--traces", default="*", help="comma-separated globs on trace names")
    parser.add_argument("--seeds", default="0-3", help="e.g. 0-3 or 0,2")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--results", type=Path, default=RESULTS, help="cache of runs")
    parser.add_argument("--doc", type=Path, default=DOC, help="the generated record")
    parser.add_argument(
        "--baselines-from",
        metavar="REV[,REV...]",
        help="read the baselines' runs cached at these commits (the first that has one) where "
        "this code has none; refused unless every baseline's decision digest "
        "(bench/digests.json) is the same at each REV",
    )
    args = parser.parse_args(argv)
    console = Console(width=160)
    try:
        seeds = parse_seeds(args.seeds)
        policies = parse_policies(args.policies)
        settings = [s.strip() for s in args.settings.split(",") if s.strip()]
        unknown = [s for s in settings if s not in SETTINGS]
        if unknown or not settings:
            raise InvalidInput(f"--settings {args.settings!r}: use some of {', '.join(SETTINGS)}")
        if OURS not in policies or len(policies) < 2:
            raise InvalidInput("--policies: give arbiter and at least one baseline")
        if args.jobs < 1:
            raise InvalidInput(f"--jobs must be at least 1, got {args.jobs}")
        everything = corpus(args.root, args.results / "built")
        if not everything:
            raise InvalidInput(f"--root {args.root}: no traces found under it")
        entries = select(everything, args.traces)
        revs = [r.strip() for r in (args.baselines_from or "").split(",") if r.strip()]
        baselines = [args.results / baselines_code(rev) for rev in revs]
    except InvalidInput as e:
        parser.error(str(e))
    commit = code_version()
    tasks = [
        Task(e, s, p, seed) for e in entries for s in settings for p in policies for seed in seeds
    ]
    runs = run_all(tasks, args.results / commit, args.jobs, console, baselines)
    names = [e.name for e in entries]
    by_setting = {s: rows_for(runs, names, s, policies, seeds) for s in settings}
    for setting, rows in by_setting.items():
        header, cells = table(setting, rows)
        t = Table(*header, title=f"{setting}: Arbiter / best baseline")
        for line in cells:
            t.add_row(*line)
        console.print(t)
        for line in summary_lines(summarise(setting, rows)):
            console.print(f"  {setting}: {line}")
    full = (
        args.traces == "*"
        and seeds == list(DEFAULT_SEEDS)
        and policies == list(POLICIES)
        and settings == list(SETTINGS)
    )
    meta = {
        "command": shlex.join(
            ["python", "-m", "bench.corpus", *(sys.argv[1:] if argv is None else argv)]
        ),
        "commit": head_commit(),
        "code": commit,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "full": full,
        "traces": names,
        "corpus_size": len(everything),
        "globs": args.traces,
        "seeds": seeds,
        "policies": policies,
        "cpu_s": sum(run_cost(r) for r in runs.values()),
        "cost": cost_by_family(((k[0], k[2], r) for k, r in runs.items()), policies),
        "runs": len(runs),
        "reused": sum(1 for r in runs.values() if r.get("reused")),
        "baseline_runs": sum(1 for k in runs if k[2] != OURS),
        "baselines_from": args.baselines_from,
        "baselines_code": ", ".join(b.name for b in baselines),
        "jobs": args.jobs,
    }
    plot_path = args.doc.with_suffix(".png")
    plot(by_setting, plot_path)
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    args.doc.write_text(markdown(meta, by_setting, plot_path.name))
    console.print(f"wrote {args.doc} and {plot_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
