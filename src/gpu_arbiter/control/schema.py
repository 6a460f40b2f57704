"""Is the database's schema this release's, and how is it made so? (alembic, `migrations/`)

`migrate` runs each time the control plane opens its database, before anything reads it:

* a fresh database is created whole from the models (`store.Base`) and stamped at the newest
  revision;
* a database of an older release is upgraded in place, its data kept: one without alembic's
  version table but with Arbiter's tables was made by 0.1.0 (revision 0001), the last release
  without migrations. A SQLite file is first copied aside (`<file>.before-<revision>`) with
  SQLite's online backup, as SQLite cannot undo every schema change;
* a database stamped with a revision this release does not know was made by a newer release:
  it is refused in one line (`NewerDatabase`) and left as it is.

With PostgreSQL several serves may share the database; only the one holding the leader lock
opens it (`control.lease`), so two never migrate at once.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect
from sqlalchemy.engine import Connection, Engine

from gpu_arbiter.domain import ArbiterError

log = logging.getLogger("gpu_arbiter.schema")
MIGRATIONS = Path(__file__).parent / "migrations"
BASELINE = "0001"  # release 0.1.0: the schema of databases made before migrations


class NewerDatabase(ArbiterError):
    """The database was made by a newer Arbiter than this one."""


def _config(conn: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = conn
    return cfg


def head() -> str:
    """The newest revision this release knows."""
    rev = ScriptDirectory.from_config(_config()).get_current_head()
    assert rev is not None
    return rev


def current(conn: Connection) -> str | None:
    """The database's revision; None for a fresh database and for one made by 0.1.0."""
    return MigrationContext.configure(conn).get_current_revision()


def migrate(engine: Engine) -> str | None:
    """Bring the database's schema to this release's (see the module docstring). Returns what
    was done, for the log, or None when there was nothing to do."""
    from gpu_arbiter.control.store import Base  # store opens the database through here

    script = ScriptDirectory.from_config(_config())
    newest = head()
    with engine.begin() as conn:
        rev = current(conn)
        if rev == newest:
            return None
        if rev is not None and rev not in {s.revision for s in script.walk_revisions()}:
            raise NewerDatabase(
                f"the database {_name(engine)} has schema revision {rev}, made by a newer "
                f"Arbiter than this one (which knows revisions up to {newest}): run the newer "
                "release, or restore the backup taken before its upgrade"
            )
        if rev is None and "jobs" not in inspect(conn).get_table_names():
            Base.metadata.create_all(conn)
            command.stamp(_config(conn), newest)
            return None
    backup = _backup(engine, rev or BASELINE)
    with engine.begin() as conn:
        cfg = _config(conn)
        if current(conn) is None:
            command.stamp(cfg, BASELINE)
        command.upgrade(cfg, "head")
    done = f"upgraded the database {_name(engine)} from schema {rev or BASELINE} to {newest}"
    done += f"; the file before the upgrade is kept as {backup}" if backup else ""
    log.warning("%s", done)
    return done


def _name(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=True)


def _backup(engine: Engine, rev: str) -> Path | None:
    """Copy a SQLite file aside before its schema changes; PostgreSQL's DDL is transactional,
    so a failed upgrade there changes nothing."""
    if engine.dialect.name != "sqlite" or not engine.url.database:
        return None
    if engine.url.database == ":memory:":
        return None
    path = Path(engine.url.database)
    target = path.with_name(f"{path.name}.before-{rev}")
    src, dst = sqlite3.connect(path), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()
    return target
