"""Who may serve: one `arbiter serve` per state directory and per database.

A second serve on the same state must refuse before it touches anything: started anyway, it
reconciled the first one's running jobs against its own view and killed them, and overwrote the
admin token file. Each thing a serve owns is held by a lock the operating system or the database
lets go of by itself when the process dies (kill -9 included), so a restart after a crash never
waits for a lease to expire:

* the state directory: an exclusive `flock` on STATE_DIR/serve.lock;
* a SQLite database: the same on a lock file beside it (`<file>.serve.lock`), so two serves
  with different state directories cannot share one database file;
* a PostgreSQL database: a session advisory lock, held on a connection of its own for the life
  of the process. The server lets go of it when that session ends (the process died, or its
  connection was lost), which is what lets a standby take over (`--standby`).

Every lock file, and for PostgreSQL the `leader` row of the settings table, names the holder
(pid, host, URL), so a refusal says which serve is in the way. A standby waits for the same
locks in the same order instead of refusing. A leader whose database session is lost stops at
once (`Lease.watch`): a standby may already be scheduling.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, insert, select, text, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from gpu_arbiter.control.schema import migrate
from gpu_arbiter.control.store import TABLES, database_url
from gpu_arbiter.domain import ArbiterError

log = logging.getLogger("gpu_arbiter.lease")

LOCK_FILE = "serve.lock"
LEADER_KEY = "leader"
# The advisory lock every serve of one PostgreSQL database competes for: a fixed 64-bit key
# (advisory locks are per database, so one key serves every Arbiter database).
ADVISORY_KEY = 0x61726269746572  # "arbiter"
SETTINGS = TABLES["settings"]


class InUse(ArbiterError):
    """Another serve holds this state; the message names it."""


@dataclass(frozen=True, slots=True)
class Holder:
    pid: int
    host: str
    url: str

    @classmethod
    def me(cls, url: str) -> Holder:
        return cls(os.getpid(), socket.gethostname(), url)

    @classmethod
    def parse(cls, data: Any) -> Holder | None:
        try:
            return cls(int(data["pid"]), str(data["host"]), str(data["url"]))
        except (KeyError, TypeError, ValueError):
            return None

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.host}, {self.url}"


class FileLock:
    """An exclusive `flock` on one file that names its holder."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def try_acquire(self, me: Holder) -> Holder | None:
        """Take the lock and write `me` into the file; or return who holds it (None when it is
        now ours). Opening an existing file changes nothing in it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._read(fd)
            os.close(fd)
            return holder or Holder(0, "?", "starting up")
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(asdict(me)).encode() + b"\n", 0)
        self._fd = fd
        return None

    @staticmethod
    def _read(fd: int) -> Holder | None:
        try:
            return Holder.parse(json.loads(os.pread(fd, 4096, 0) or b"{}"))
        except ValueError:
            return None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor lets go of the flock
            self._fd = None


# A leader cut off from the database (network down, not dead) must stop before the server
# lets go of its lock: its own side of the lock's connection gives up when data stays unacked
# for 5 s (`tcp_user_timeout`, checked every second by `Lease.watch`), the server's side after
# 6 s of silence and 3 unanswered probes 2 s apart (12 s), so a standby leads within ~15 s.
_CLIENT_KEEPALIVE = {
    "keepalives": 1,
    "keepalives_idle": 2,
    "keepalives_interval": 1,
    "keepalives_count": 3,
    "tcp_user_timeout": 5000,
}
_SERVER_KEEPALIVE = {
    "tcp_keepalives_idle": 6,
    "tcp_keepalives_interval": 2,
    "tcp_keepalives_count": 3,
}


class AdvisoryLock:
    """PostgreSQL's session advisory lock on a connection of its own, and the `leader` row."""

    def __init__(self, url: str) -> None:
        self.engine: Engine = create_engine(
            url, poolclass=NullPool, connect_args=dict(_CLIENT_KEEPALIVE)
        )
        self._conn: Any = None

    def try_acquire(self, me: Holder) -> Holder | None:
        conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            for name, value in _SERVER_KEEPALIVE.items():
                conn.execute(text(f"SET {name} = {int(value)}"))
            got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": ADVISORY_KEY})
            if not got.scalar():
                row = conn.execute(select(SETTINGS.c.value).where(SETTINGS.c.key == LEADER_KEY))
                found = row.first()
                conn.close()
                return (Holder.parse(found.value) if found else None) or Holder(0, "?", "?")
            migrate(self.engine)  # the leader makes the schema, or upgrades an older one
        except Exception:
            conn.close()  # a refused (newer) schema lets go of the lock too
            raise
        value = asdict(me) | {"since": time.time()}
        with self.engine.begin() as tx:
            done = tx.execute(
                update(SETTINGS).where(SETTINGS.c.key == LEADER_KEY).values(value=value)
            )
            if done.rowcount == 0:
                tx.execute(insert(SETTINGS).values(key=LEADER_KEY, value=value))
        self._conn = conn
        return None

    def alive(self) -> bool:
        """Whether the session holding the lock still answers."""
        try:
            self._conn.execute(text("SELECT 1"))
            return True
        except Exception:
            return False

    def release(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()  # ending the session lets go of the advisory lock
            except Exception:
                pass
            self._conn = None
        self.engine.dispose()


class Lease:
    """Everything one serve must hold before it touches its state: see the module docstring."""

    def __init__(self, state_dir: Path, db: str, url: str) -> None:
        self.me = Holder.me(url)
        self.state_dir = state_dir
        self.parts: list[tuple[str, FileLock | AdvisoryLock]] = [
            (f"state dir {state_dir}", FileLock(state_dir / LOCK_FILE))
        ]
        self.db_url = database_url(db)
        if self.db_url.startswith("sqlite"):
            path = self.db_url.split("///", 1)[1]
            if path and path != ":memory:":
                self.parts.append((f"database {path}", FileLock(Path(f"{path}.serve.lock"))))
        else:
            self.parts.append((f"database {db}", AdvisoryLock(self.db_url)))
        self._held = 0
        self._watching = False

    def acquire(
        self, wait: bool = False, every_s: float = 0.5, waiting: Callable[[str], None] | None = None
    ) -> None:
        """Take every lock in a fixed order (so two waiting serves cannot deadlock). Without
        `wait`, raise `InUse` naming the holder of the first one taken, releasing any taken;
        with it, call `waiting(message)` once and retry every `every_s` seconds."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        told = False
        while self._held < len(self.parts):
            what, lock = self.parts[self._held]
            try:
                holder = lock.try_acquire(self.me)
            except OperationalError as e:
                if not wait:
                    self.release()
                    raise
                # A standby outlives a database that restarts: it keeps trying.
                why = str(e.orig or e).strip().splitlines()[0]
                log.warning("%s: cannot reach it (%s); trying again", what, why)
                time.sleep(every_s)
                continue
            if holder is None:
                self._held += 1
                continue
            message = f"{what} is in use by another arbiter serve ({holder})"
            if not wait:
                self.release()
                raise InUse(f"{message}; stop it first, or start this one with --standby")
            if not told and waiting is not None:
                waiting(f"standby: {message}; waiting to take over")
                told = True
            time.sleep(every_s)

    def watch(self, lost: Callable[[str], None], every_s: float = 1.0) -> None:
        """Check the database session that holds the leader lock every `every_s` seconds and
        call `lost` once it is gone: a standby may take over as soon as the server noticed."""
        locks = [lock for _, lock in self.parts if isinstance(lock, AdvisoryLock)]
        if not locks or self._watching:
            return
        self._watching = True

        def run() -> None:
            while self._watching:
                time.sleep(every_s)
                if self._watching and not locks[0].alive():
                    lost("lost the database session that held the leader lock")
                    return

        threading.Thread(target=run, name="arbiter-lease", daemon=True).start()

    def release(self) -> None:
        self._watching = False
        for _, lock in reversed(self.parts[: self._held]):
            lock.release()
        self._held = 0
