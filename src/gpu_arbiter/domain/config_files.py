"""Shared helpers that turn YAML files and pydantic errors into one-line `InvalidInput`s.

Every config file (clusters, teams, prices, TCO) is validated at the edge the same way, so a
user sees the same kind of message naming the bad field whichever file they got wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpu_arbiter.domain.errors import InvalidInput


def first_error(source: str, error: ValidationError) -> InvalidInput:
    """`source: field.path: message` for the first problem pydantic found."""
    err = error.errors()[0]
    loc = ".".join(str(part) for part in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    return InvalidInput(f"{source}: {loc}: {msg}" if loc else f"{source}: {msg}")


def read_yaml_mapping(path: str | Path, source: str, expected: str = "a mapping") -> dict[str, Any]:
    """Read a YAML file that must hold a mapping; every failure is an `InvalidInput`."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InvalidInput(f"{source} {p}: cannot read ({e.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise InvalidInput(f"{source} {p}: malformed YAML{where}") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"{source} {p}: expected {expected}, got {type(data).__name__}")
    return data
