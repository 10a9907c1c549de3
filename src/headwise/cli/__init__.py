"""The ``headwise`` command line (typer). One subcommand per file in this package.

``main()`` turns a user's mistake — a bad option, a ``CLIError``, or a ValueError / TypeError raised
by the library's input checks — into one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import click
import typer

from headwise.cli._app import CLIError, app

__all__ = ["app", "main", "CLIError"]

for _mod in pkgutil.iter_modules(__path__):
    if not _mod.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_mod.name}")


def _fail(message: str) -> None:
    message = " ".join(str(message).split())  # one line, whatever the exception held
    print(f"headwise: error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``headwise`` console script and of ``python -m headwise``."""
    command = typer.main.get_command(app)
    try:
        rc = command.main(args=argv, prog_name="headwise", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as e:  # `headwise` alone: the help, exit 0
        print(e.ctx.get_help() if e.ctx else str(e))
        sys.exit(0)
    except click.exceptions.UsageError as e:
        hint = f" (see 'headwise {e.ctx.info_name} --help')" if e.ctx and e.ctx.parent else ""
        _fail(f"{e.format_message()}{hint}")
    except click.exceptions.Abort:
        print("headwise: interrupted", file=sys.stderr)
        sys.exit(130)
    except KeyboardInterrupt:
        print("headwise: interrupted", file=sys.stderr)
        sys.exit(130)
    except click.exceptions.ClickException as e:
        _fail(e.format_message())
    except (CLIError, ValueError, TypeError, FileNotFoundError, IsADirectoryError, PermissionError) as e:
        _fail(str(e))
    sys.exit(rc if isinstance(rc, int) else 0)
