"""Whether a job's command names a program that can be started, asked the same way by every
backend, so that a job whose program is not there is a launch failure with the same reason
everywhere (docs/failures.md), never a run that exits 127 and is charged for it.

Only the command's first word is checked, and only when it names a program: a shell keyword or
builtin, a variable, a redirection or quoting is shell syntax that only running the command
resolves. A word with a `/` must be an executable file (a relative one, in the job's working
directory); any other word must be an executable file in a folder of the job's PATH. That is
what the shell's own lookup (`sh: 1: foo: not found`) would fail on.

The local backend checks before it starts the job (`missing`). A Slurm job's program is on its
node, which the server may not see, so its batch script runs the same test there, as the job's
user, with the job's environment and working directory, before it starts the command
(`shell_test`). Either way the reason is `not_found(word)`.
"""

from __future__ import annotations

import os
import shlex
import shutil

# Words the shell runs itself: a command starting with one is not checked for a program.
SHELL_WORDS = frozenset(
    "! { } ( ) case do done elif else esac fi for if in then until while . : [ alias bg break cd "
    "command continue echo eval exec exit export false fg getopts hash jobs kill local printf "
    "pwd read readonly return set shift test times trap true type ulimit umask unalias unset "
    "wait".split()
)
_SYNTAX = frozenset("$`'\"\\<>|;&(){}*?[]~=")


def program(command: str) -> str | None:
    """The first word of `command` when it names a program to look up; None when it is empty
    or shell syntax."""
    words = command.split(None, 1)
    word = words[0] if words else ""
    if not word or word in SHELL_WORDS or any(c in _SYNTAX for c in word):
        return None
    return word


def not_found(word: str) -> str:
    """The reason a job whose program `word` is not there fails with, on every backend."""
    return f"{word}: not found or not executable" if "/" in word else f"{word}: not found"


def missing(command: str, path: str | None, cwd: str | os.PathLike[str]) -> str | None:
    """`not_found(word)` when the command's program is not there for a job with PATH `path`
    running in `cwd`; None when it is there or the command starts with shell syntax."""
    word = program(command)
    if word is None:
        return None
    if "/" in word:
        file = os.path.join(cwd, word)
        there = os.path.isfile(file) and os.access(file, os.X_OK)
    else:
        there = shutil.which(word, path=path) is not None
    return None if there else not_found(word)


def shell_test(word: str) -> str:
    """A POSIX sh condition that holds when `word` names a program the job can start: the test
    `missing` makes, for a batch script to run where the job runs."""
    w = shlex.quote(word)
    if "/" in word:
        return f"[ -f {w} ] && [ -x {w} ]"
    found = f'[ -f "${{d:-.}}"/{w} ] && [ -x "${{d:-.}}"/{w} ] && exit 0'
    return f"(IFS=:; set -f; for d in $PATH; do {found}; done; exit 1)"
