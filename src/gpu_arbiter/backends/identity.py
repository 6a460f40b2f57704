"""Which unix user a job runs as, and how a job starts as that user with only its own environment.

A team may name a unix user (`run_as`); its jobs run as that user, so file permissions keep
them out of the server's state (database, tokens) and out of other teams' work. A team without
one runs as the server's own user. Root is refused unless the operator allowed it explicitly:
a job running as root reads every file the server can.

Switching users needs the server to run as root. The job's command is then started through
`setpriv` (util-linux), and its environment reaches it on standard input, read by the job's own
shell after the switch: no process running as root ever sees the job's variables (a team's
`LD_PRELOAD` must not run code as root), and they never appear on a command line, which every
local user can read.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
from dataclasses import dataclass

from gpu_arbiter.domain import ArbiterError

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class JobRefused(ArbiterError):
    """The job cannot run as the user its team names (or as root without permission)."""


@dataclass(frozen=True, slots=True)
class JobUser:
    name: str
    uid: int
    gid: int
    home: str
    switch: bool  # the server runs as another user (root) and must switch to this one

    def command(self, command: str) -> str:
        """The shell command that runs `command` as this user, reading its environment (lines
        made by `env_script`) from standard input when the user is switched."""
        if not self.switch:
            return command
        inner = 'eval "$(cat)"; exec /bin/sh -c "$0" </dev/null'
        return (
            f"exec setpriv --reuid={self.uid} --regid={self.gid} --init-groups -- "
            f"/bin/sh -c {shlex.quote(inner)} {shlex.quote(command)}"
        )


def job_user(run_as: str | None, team: str, allow_root: bool) -> JobUser:
    """The user a team's job runs as, or JobRefused saying why it cannot run."""
    me = os.geteuid()
    if run_as is None:
        entry = _entry(me)
        if me == 0 and not allow_root:
            raise root_refused(team, None)
        return JobUser(entry.pw_name, me, entry.pw_gid, entry.pw_dir, switch=False)
    try:
        entry = pwd.getpwnam(run_as)
    except KeyError:
        raise JobRefused(f"team {team}: run_as user {run_as!r} does not exist here") from None
    if entry.pw_uid == 0 and not allow_root:
        raise root_refused(team, run_as)
    if entry.pw_uid == me:
        return JobUser(entry.pw_name, me, entry.pw_gid, entry.pw_dir, switch=False)
    if me != 0:
        raise JobRefused(
            f"team {team}: the server runs as uid {me} and cannot run jobs as {run_as!r} "
            "(switching users needs the server to run as root)"
        )
    if shutil.which("setpriv") is None:
        raise JobRefused("running jobs as another user needs setpriv (util-linux)")
    return JobUser(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir, switch=True)


def root_refused(team: str, run_as: str | None) -> JobRefused:
    """Why a team's job may not run as root without `--allow-root-jobs` (every backend that
    runs jobs on the server's hosts says the same)."""
    if run_as is None:
        return JobRefused(
            f"team {team} has no run_as user and the server runs as root: set the team's "
            f"run_as (PUT /v1/teams/{team}) or start the server with --allow-root-jobs"
        )
    return JobRefused(f"team {team}: run_as {run_as!r} is root; start with --allow-root-jobs")


def env_script(env: dict[str, str]) -> bytes:
    """`export NAME=value` lines the job's shell evaluates after switching users."""
    lines = []
    for key, value in env.items():
        if not _ENV_KEY.fullmatch(key):
            raise JobRefused(f"environment variable name {key!r} is not a shell name")
        lines.append(f"export {key}={shlex.quote(value)}\n")
    return "".join(lines).encode()


def _entry(uid: int) -> pwd.struct_passwd:
    try:
        return pwd.getpwuid(uid)
    except KeyError:  # a uid without a passwd entry (some containers)
        home = os.environ.get("HOME", "/")
        return pwd.struct_passwd((str(uid), "x", uid, os.getegid(), "", home, "/bin/sh"))
