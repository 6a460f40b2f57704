"""The server's files are the server's alone: its state directory (job logs, process state, the
admin token) is 0700 and every file in it 0600, as is a SQLite database with its journal files.

`arbiter serve` sets its umask to 077 so whatever it creates is private from the start, and
calls `make_private` on every start to tighten what an older version, a restore from backup or
a hand-made token file left readable. Jobs run as other users (`backends.identity`) and so
cannot read any of it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpu_arbiter.control.store import database_url

_SQLITE = "sqlite:///"
_JOURNALS = ("", "-wal", "-shm", "-journal")


def make_private(state_dir: Path, db: str) -> None:
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    _chmod(state_dir, 0o700)
    for root, dirs, files in os.walk(state_dir):
        for name in dirs:
            _chmod(Path(root) / name, 0o700)
        for name in files:
            _chmod(Path(root) / name, 0o600)
    url = database_url(db)
    if url.startswith(_SQLITE) and not url.endswith(":memory:"):
        path = url[len(_SQLITE) :]
        for suffix in _JOURNALS:
            _chmod(Path(path + suffix), 0o600)


def _chmod(path: Path, mode: int) -> None:
    """Set `mode` on a file or directory (never through a symbolic link); gone is fine."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or stat.S_IMODE(st.st_mode) == mode:
        return
    path.chmod(mode)
