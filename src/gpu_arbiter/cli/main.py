"""Entry point of the `arbiter` command. Each command module exposes `register(app)`.

Errors Arbiter raises on purpose (`ArbiterError`, which includes `InvalidInput`) become one line
on stderr and exit code 2 — never a traceback.
"""

from __future__ import annotations

import sys

import typer

from gpu_arbiter.cli import agent, bench, bill, client, serve, simulate, tco
from gpu_arbiter.domain.errors import ArbiterError

app = typer.Typer(
    name="arbiter",
    help="Decide who gets which GPUs: simulate policies, run the control plane, bill teams.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

for module in (simulate, bench, bill, tco, serve, agent, client):
    module.register(app)


def main() -> None:
    try:
        app(standalone_mode=False)
    except ArbiterError as e:
        typer.echo(f"arbiter: error: {e}", err=True)
        sys.exit(2)
    except FileNotFoundError as e:
        typer.echo(f"arbiter: error: {e.filename}: no such file", err=True)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("arbiter: aborted", err=True)
        sys.exit(130)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:  # click usage errors and the like
        import click

        if isinstance(e, click.ClickException):
            e.show()
            sys.exit(e.exit_code)
        raise
