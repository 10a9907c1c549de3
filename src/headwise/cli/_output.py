"""Where the subcommands write their pictures (checked up front, errors as one line: ``CLIError``) and the layer ×
head table they print."""

from __future__ import annotations

from pathlib import Path

from headwise import study
from headwise.cli._app import CLIError

__all__ = ["prepare_output", "prepare_folder", "print_head_table", "table_console", "write_failed", "write_pruning"]


def prepare_output(path: Path, option: str) -> Path:
    """Make sure ``path``'s folder exists and ``path`` names a picture file (png, svg, pdf).

    Raises:
        CLIError: a folder given where a file is expected, an unsupported suffix, or a folder that
            cannot be created (the message names ``option``).
    """
    from headwise.viz import FORMATS

    if path.suffix.lower().lstrip(".") not in FORMATS:
        raise CLIError(f"{option}: expected a file name ending in .png, .svg or .pdf, got '{path}'")
    if path.is_dir():
        raise CLIError(f"{option}: '{path}' is a folder; expected a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CLIError(f"{option}: cannot create the folder '{path.parent}': {e.strerror or e}") from None
    return path


def write_failed(option: str, path: Path, error: OSError) -> CLIError:
    """The one-line error for a picture that could not be written."""
    return CLIError(f"{option}: cannot write '{path}': {error.strerror or error}")


def prepare_folder(path: Path, option: str) -> Path:
    """Create the output folder ``path`` (and its parents) if needed.

    Raises:
        CLIError: ``path`` is a file, or cannot be created (the message names ``option``).
    """
    if path.exists() and not path.is_dir():
        raise CLIError(f"{option}: '{path}' exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CLIError(f"{option}: cannot create the folder '{path}': {e.strerror or e}") from None
    return path


def write_pruning(result, out: Path, title: str) -> dict[str, Path]:
    """``pruning.png`` and ``pruning.csv`` of an importance run (:func:`headwise.study.run_importance`) in ``out``:
    the one schema of ``headwise heads --importance`` and ``headwise lab prune``. Returns ``{name: path}``."""
    from headwise.viz.pruning import plot_pruning, write_pruning_csv

    return {
        "pruning.png": plot_pruning(result, out / "pruning.png", title=f"{title} — {result.objective}").path,
        "pruning.csv": write_pruning_csv(result, out / "pruning.csv"),
    }


def table_console():
    """The rich console that tables are printed on: the terminal's, or 140 columns when piped or captured (a table
    is not squeezed into 80 columns)."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=140)


def print_head_table(console, report, *, layer: int | None = None, title: str = "", columns=None) -> None:
    """Print a layer × head table of ``report`` (a :class:`~headwise.analysis.HeadReport`) with rich.

    Args:
        console: a ``rich.console.Console``.
        report: the report.
        layer: only this layer's heads.
        title: the table's caption line.
        columns: (metric, header, format) of each column (default :data:`headwise.study.COLUMNS`; decoders:
            :data:`headwise.study.DECODER_COLUMNS`).
    """
    from rich.table import Table

    columns = study.COLUMNS if columns is None else columns
    table = Table(title=title or None, header_style="bold", show_lines=False, pad_edge=False)
    table.add_column("L", justify="right")
    table.add_column("H", justify="right")
    table.add_column("role")
    for _, header, _ in columns:
        table.add_column(header, justify="right")
    table.add_column("pos", justify="right")
    styles = {"broad": "magenta", "other": "dim"}
    layers = range(report.num_layers) if layer is None else [layer]
    for lay in layers:
        for h in range(report.num_heads):
            role, cells = study.head_row(report, lay, h, columns)
            table.add_row(str(lay), str(h), f"[{styles.get(role, 'bold cyan')}]{role}[/]", *cells)
        if layer is None and lay < report.num_layers - 1:
            table.add_section()
    console.print(table)
