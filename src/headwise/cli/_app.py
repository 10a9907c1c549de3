"""The typer application that every subcommand file registers on.

One subcommand per file in ``headwise/cli/``: each module imports ``app`` from here and decorates
its command with ``@app.command()``. ``headwise.cli.main`` imports every non-underscore module of the
package, so a new subcommand needs no edit anywhere else.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="headwise",
    help="Multi-head attention and positional encodings: run, verify, measure and picture them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


class CLIError(Exception):
    """A user's mistake: printed as one line on stderr, exit status 2."""


@app.callback()
def _root() -> None:
    """Multi-head attention and positional encodings: run, verify, measure and picture them."""
