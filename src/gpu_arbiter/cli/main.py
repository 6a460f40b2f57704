"""Entry point of the `arbiter` command. Each command module exposes `register(app)`.

Commands are loaded lazily: `COMMANDS` says which module registers each one, and only that
module is imported when the command runs. A client command (`queue`, `submit`, `teams`, ...)
therefore never pays for the simulator, matplotlib, FastAPI or SQLAlchemy. A module that
registers a new command must be named for it here.

Every failure is one line on stderr and exit code 2 — never a traceback: errors Arbiter raises
on purpose (`ArbiterError`, which includes `InvalidInput`) and click's usage errors (an unknown
command or option, a value of the wrong type).
"""

from __future__ import annotations

import importlib
import sys
from typing import Annotated

import click
import typer
from typer.core import TyperGroup

from gpu_arbiter.domain.errors import ArbiterError

# command -> the module of `gpu_arbiter.cli` that registers it, in `arbiter --help` order.
COMMANDS: dict[str, str] = {
    "simulate": "simulate",
    "bench": "bench",
    "bill": "bill",
    "tco": "tco",
    "whatif": "whatif",
    "serve": "serve",
    "agent": "agent",
    "submit": "client",
    "queue": "client",
    "cancel": "client",
    "jobs": "client",
    "logs": "client",
    "nodes": "admin",
    "teams": "admin",
    "tokens": "admin",
    "prices": "admin",
    "drain": "client",
    "history": "history",
}


class LazyCommands(TyperGroup):
    """A command group that imports a command's module only when the command is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMANDS.get(cmd_name)
        if module is None:
            return None
        return _module_group(module).get_command(ctx, cmd_name)


_loaded: dict[str, click.Group] = {}


def _module_group(module: str) -> click.Group:
    """The commands one module registers, as a click group (built once per process)."""
    if module not in _loaded:
        sub = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        importlib.import_module(f"gpu_arbiter.cli.{module}").register(sub)
        _loaded[module] = typer.main.get_group(sub)
    return _loaded[module]


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("gpu-arbiter")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from gpu_arbiter import __version__

        return __version__


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"arbiter {version()}")
        raise typer.Exit()


app = typer.Typer(
    name="arbiter",
    cls=LazyCommands,
    help="Decide who gets which GPUs: simulate policies, run the control plane, bill teams.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Decide who gets which GPUs: simulate policies, run the control plane, bill teams."""


def fail(message: str) -> None:
    """One line on stderr and exit code 2."""
    typer.echo(f"arbiter: error: {' '.join(message.split())}", err=True)
    sys.exit(2)


def main() -> None:
    try:
        code = app(standalone_mode=False, prog_name="arbiter")
    except ArbiterError as e:
        fail(str(e))
    except FileNotFoundError as e:
        fail(f"{e.filename}: no such file")
    except click.exceptions.NoArgsIsHelpError as e:  # `arbiter` or a group alone: its help
        e.show()
        sys.exit(2)
    except click.UsageError as e:  # unknown command or option, a bad value
        where = e.ctx.command_path if e.ctx is not None else "arbiter"
        typer.echo(f"{where}: error: {' '.join(e.format_message().split())}", err=True)
        sys.exit(2)
    except click.ClickException as e:
        fail(e.format_message())
    except (click.exceptions.Abort, KeyboardInterrupt):
        typer.echo("arbiter: aborted", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
