"""`arbiter history export`: the cluster's own history as a trace file (admin).

From a running service (`--url`, `--token`: GET /v1/history, streamed to the file) or straight
from its database (`--db`, for an offline copy); both write the same arbiter-history JSON-lines
file (docs/history-format.md), which `arbiter simulate|bench --format arbiter` and
`arbiter whatif --history` replay.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import httpx
import typer

from gpu_arbiter.cli.client import DEFAULT_URL, Token, Url
from gpu_arbiter.domain.errors import ArbiterError, InvalidInput


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="The cluster's own history as a replayable trace.")
    group.command("export")(export)
    app.add_typer(group, name="history")


def parse_since(text: str | None) -> float | None:
    """Epoch seconds from an ISO date or date-time (UTC unless it says otherwise) or a number."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        try:
            stamp = datetime.fromisoformat(text.strip())
        except ValueError:
            raise InvalidInput(
                f"--since {text!r}: expected a date (2026-11-01), a date-time or epoch seconds"
            ) from None
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=UTC)
        value = stamp.timestamp()
    if not (math.isfinite(value) and value >= 0):
        raise InvalidInput(f"--since {text!r}: must be a time after 1970")
    return value


def export(
    out: Annotated[Path, typer.Option(help="The JSON-lines file to write.")],
    url: Url = DEFAULT_URL,
    token: Token = "",
    db: Annotated[
        str | None,
        typer.Option(help="Read this database directly instead of asking --url (offline)."),
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="Only jobs submitted at or after this date (UTC).")
    ] = None,
) -> None:
    """Write every job the service has seen (spec, run segments, end) with the cluster, teams
    and prices in force, as an arbiter-history trace."""
    start = parse_since(since)
    if out.is_dir():
        raise InvalidInput(f"--out {out}: is a directory; give a file name")
    if not out.parent.is_dir():
        raise InvalidInput(f"--out {out}: no such directory {out.parent}")
    partial = out.with_name(out.name + ".partial")
    if db is not None:
        jobs = _from_db(db, start, partial)
    else:
        jobs = _from_api(url, token, start, partial)
    partial.replace(out)  # a cut-off export never looks like a whole one
    typer.echo(f"wrote {out}: {jobs} jobs")


def _from_db(db: str, since: float | None, path: Path) -> int:
    from gpu_arbiter.control.history import history_ndjson
    from gpu_arbiter.control.store import open_database

    if "://" not in db and not Path(db).expanduser().is_file():
        raise InvalidInput(f"--db {db}: no such database file")  # never create an empty one
    engine = open_database(db)
    try:
        return _write(history_ndjson(engine, since), path)
    finally:
        engine.dispose()


def _from_api(url: str, token: str, since: float | None, path: Path) -> int:
    if not token:
        raise InvalidInput("--token (or ARBITER_TOKEN) is required with --url; or use --db")
    params = {} if since is None else {"since": since}
    base = url.split(",")[0].strip().rstrip("/")
    try:
        with httpx.stream(
            "GET",
            base + "/v1/history",
            params=params,
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
        ) as r:
            if r.status_code >= 400:
                r.read()
                try:
                    detail = r.json().get("detail", r.text)
                except ValueError:
                    detail = r.text
                raise ArbiterError(f"{r.status_code}: {detail}")
            return _write(r.iter_bytes(), path)
    except httpx.HTTPError as e:
        path.unlink(missing_ok=True)
        raise ArbiterError(f"cannot read the history from {base}: {e}") from None


def _write(chunks: Iterable[bytes], path: Path) -> int:
    """Write the byte chunks; the number of job lines (all lines but the header)."""
    lines = 0
    with path.open("wb") as f:
        for chunk in chunks:
            f.write(chunk)
            lines += chunk.count(b"\n")
    return max(lines - 1, 0)
