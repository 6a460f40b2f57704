"""Errors that carry a message fit to show a user as one line."""


class ArbiterError(Exception):
    """Base of every error Arbiter raises on purpose; its message names what is wrong."""


class InvalidInput(ArbiterError, ValueError):
    """Input (a job, a cluster file, a trace row, a flag) that Arbiter refuses, unchanged."""
