"""Errors of the control plane that map to one HTTP status each (see `api/problems.py`)."""

from gpu_arbiter.domain import ArbiterError


class NotFound(ArbiterError):
    """No such object — or one the caller may not see, which must look the same (404)."""


class Conflict(ArbiterError):
    """The request clashes with the current state, e.g. an idempotency key reused for a
    different job (409)."""


class Unavailable(ArbiterError):
    """The service cannot do this yet, e.g. no GPU nodes are registered (503)."""
