"""Simulation reports on the dashboard: the `arbiter bench` and `arbiter whatif` results folders
under one directory (`arbiter serve --reports DIR`), rendered from their results.json with the
same KPI rows and "best policy" rule as report.md (`sim.report`, `sim.whatif`), and their plots
and records served as files.

DIR may itself be a results folder, hold several (one level down), or both. Only files inside
a listed folder with a known suffix are served, so a crafted name cannot reach anything else.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import quote

SERVED = {
    ".png": "image/png",
    ".csv": "text/csv; charset=utf-8",
    ".md": "text/markdown; charset=utf-8",
    ".json": "application/json",
}


def find_reports(root: Path | None) -> dict[str, Path]:
    """Results folders by name: `root` itself (named after it) and its direct subfolders."""
    if root is None or not root.is_dir():
        return {}
    found: dict[str, Path] = {}
    if (root / "results.json").is_file():
        found[root.resolve().name or "results"] = root
    for sub in sorted(p for p in root.iterdir() if p.is_dir()):
        if (sub / "results.json").is_file() and sub.name not in found:
            found[sub.name] = sub
    return found


def report_file(folder: Path, name: str) -> Path | None:
    """`folder/name` when it is a file that may be served (one of `SERVED`, inside `folder`)."""
    path = (folder / name).resolve()
    if path.suffix not in SERVED or not path.is_file():
        return None
    if not path.is_relative_to(folder.resolve()):
        return None
    return path


def index_html(reports: dict[str, Path], root: Path | None) -> str:
    if root is None:
        return (
            "<p class='muted'>No reports directory: start the service with "
            "<code>arbiter serve --reports DIR</code>, where DIR holds "
            "<code>arbiter bench --out</code> folders.</p>"
        )
    if not reports:
        return f"<p class='muted'>No results.json found in {escape(str(root))}.</p>"
    rows = []
    for name, folder in reports.items():
        doc = _load(folder)
        cluster = doc.get("cluster") or {}
        if doc.get("kind") == "whatif":  # `arbiter whatif`: its columns stand for policies
            first = next(iter((doc.get("columns") or {}).values()), {})
            cluster = {"name": first.get("cluster", "?"), "gpus": first.get("gpus", "?")}
            doc["policies"] = {f"what if: {c}": None for c in doc.get("columns") or {}}
        rows.append(
            "<tr>"
            f"<td><a href='/reports/{quote(name)}/'>{escape(name)}</a></td>"
            f"<td>{escape(str(doc.get('workload', '?')))}</td>"
            f"<td>{escape(str(cluster.get('name', '?')))} ({cluster.get('gpus', '?')} GPUs)</td>"
            f"<td>{escape(', '.join(doc.get('policies', {})))}</td>"
            "</tr>"
        )
    return (
        "<table class='grid' id='reports'><thead><tr><th>report</th><th>workload</th>"
        "<th>cluster</th><th>policies</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )


def report_html(name: str, folder: Path) -> str:
    """One report: what was replayed, the KPI table (best per row marked), plots, records.
    A replay under several seeds (`arbiter bench --seeds`) shows each KPI's mean and range
    over the seeds first, then every seed's own table."""
    from gpu_arbiter.sim.plots import PLOTS  # matplotlib only when a report is shown

    doc = _load(folder)
    if doc.get("kind") == "whatif":
        return _whatif_html(name, folder, doc)
    kpis: dict[str, dict] = doc.get("policies", {})
    names = list(kpis)
    cluster = doc.get("cluster") or {}
    first = next(iter(kpis.values()), {})
    by_seed: dict[str, dict[str, dict]] = doc.get("by_seed") or {}
    seeds = ", ".join(by_seed) if by_seed else str(doc.get("seed", "?"))
    facts = [
        f"workload <b>{escape(str(doc.get('workload', '?')))}</b>",
        f"cluster {escape(str(cluster.get('name', '?')))} ({cluster.get('gpus', '?')} GPUs)",
        f"{first.get('jobs', '?')} jobs, seed{'s' if by_seed else ''} {escape(seeds)}",
    ]
    if doc.get("trace"):
        facts.append(f"trace read: {escape(str(doc['trace'].get('summary', '')))}")
    tables = f"<table class='grid kpis' id='kpis'>{_kpi_table(kpis)}</table>"
    if by_seed:
        tables = (
            f"<h2>Across seeds {escape(seeds)}: mean (min – max)</h2>"
            f"<table class='grid kpis' id='across-seeds'>"
            f"{_spread_table(doc.get('across_seeds') or {})}</table>"
        ) + "".join(
            f"<h2>Seed {escape(seed)}</h2>"
            f"<table class='grid kpis seed' data-seed='{escape(seed)}'"
            f"{' id=kpis' if seed == str(doc.get('seed')) else ''}>{_kpi_table(runs)}</table>"
            for seed, runs in by_seed.items()
        )
    base = f"/reports/{quote(name)}/"
    plots = "".join(
        f"<figure><img src='{base}{quote(file)}' alt='{escape(title)}'>"
        f"<figcaption>{escape(title)}</figcaption></figure>"
        for file, (title, _) in PLOTS.items()
        if (folder / file).is_file()
    )
    records = " · ".join(
        f"<a href='{base}{quote(n)}/records.csv'>{escape(n)}/records.csv</a>"
        for n in names
        if (folder / n / "records.csv").is_file()
    )
    return (
        f"<p>{' · '.join(facts)}</p>{tables}"
        "<p class='muted'>Best value per row in bold green (none marked when all tie).</p>"
        f"<h2>Plots</h2><div class='plots'>{plots or '<p class=muted>No plots.</p>'}</div>"
        f"<h2>Files</h2><p><a href='{base}report.md'>report.md</a> · "
        f"<a href='{base}results.json'>results.json</a>"
        f"{' · ' + records if records else ''}</p>"
    )


def _whatif_html(name: str, folder: Path, doc: dict[str, Any]) -> str:
    """An `arbiter whatif` report: its rows as report.md has them, one column per change."""
    from gpu_arbiter.sim.whatif import PLOT, table_rows

    columns: dict[str, dict] = doc.get("columns") or {}
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join(
        f"<tr><th>{escape(label)}</th>" + "".join(f"<td>{escape(v)}</td>" for v in cells) + "</tr>"
        for label, cells in (table_rows(columns) if columns else [])
    )
    base = f"/reports/{quote(name)}/"
    plot = (
        f"<figure><img src='{base}{PLOT}' alt='queueing delay by team'></figure>"
        if (folder / PLOT).is_file()
        else ""
    )
    notes = "".join(f"<li>{escape(str(n))}</li>" for n in doc.get("notes") or [])
    return (
        f"<p>what if, from history <b>{escape(str(doc.get('workload', '?')))}</b></p>"
        f"<ul>{notes}</ul><table class='grid kpis' id='whatif'><thead><tr><th></th>{head}"
        f"</tr></thead><tbody>{body}</tbody></table><div class='plots'>{plot}</div>"
        f"<h2>Files</h2><p><a href='{base}report.md'>report.md</a> · "
        f"<a href='{base}results.json'>results.json</a></p>"
    )


def _kpi_table(kpis: dict[str, dict]) -> str:
    """The head and body of a KPI table: a row per report KPI, a column per policy."""
    from gpu_arbiter.sim.report import KPIS, best_policies

    names = list(kpis)
    rows = []
    for kpi in KPIS:
        try:
            best = set(best_policies(kpi, kpis))
            cells = [(n, kpi.show(kpi.value(kpis[n]))) for n in names]
        except (KeyError, TypeError, ValueError):
            continue  # a results.json from an older bench without this KPI
        rows.append(_row(kpi.label, cells, best, len(names)))
    return _table(names, rows)


def _spread_table(spread: dict[str, dict[str, dict[str, float]]]) -> str:
    """Each KPI's mean (min – max) over the seeds per policy; the best by the mean."""
    from gpu_arbiter.sim.report import KPIS, ties

    names = list(spread)
    rows = []
    for kpi in KPIS:
        try:
            stats = {n: spread[n][kpi.label] for n in names}
            means = [s["mean"] for s in stats.values()]
        except (KeyError, TypeError):
            continue
        top = min(means) if kpi.lower_is_better else max(means)
        best = {n for n, s in stats.items() if ties(s["mean"], top)}
        cells = [
            (n, f"{kpi.show(s['mean'])} ({kpi.show(s['min'])} – {kpi.show(s['max'])})")
            for n, s in stats.items()
        ]
        rows.append(_row(kpi.label, cells, best, len(names)))
    return _table(names, rows)


def _row(label: str, cells: list[tuple[str, str]], best: set[str], policies: int) -> str:
    tds = "".join(
        f"<td class='num{' best' if n in best and len(best) < policies else ''}'>{escape(v)}</td>"
        for n, v in cells
    )
    return f"<tr><th>{escape(label)}</th>{tds}</tr>"


def _table(names: list[str], rows: list[str]) -> str:
    head = "".join(f"<th>{escape(n)}</th>" for n in names)
    return f"<thead><tr><th>KPI</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody>"


def _load(folder: Path) -> dict[str, Any]:
    try:
        doc = json.loads((folder / "results.json").read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}
