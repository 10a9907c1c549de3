"""``headwise pe``: the sinusoidal positional-encoding heatmap (the first article's Figure 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from headwise.cli._app import CLIError, app
from headwise.cli._output import prepare_output, write_failed


@app.command()
def pe(
    max_len: Annotated[int, typer.Option("--max-len", help="Positions (rows).")] = 50,
    d_model: Annotated[int, typer.Option("--d-model", help="Dimensions (columns); even.")] = 64,
    out: Annotated[Path, typer.Option("--out", help="The picture to write (.png, .svg or .pdf).")] = Path("pe.png"),
) -> None:
    """Draw the sinusoidal positional encoding (Figure 2).

    A heatmap of positions × dimensions, as the first article's Figure 2.
    """
    if max_len <= 0:
        raise CLIError(f"--max-len: expected a positive integer, got {max_len}")
    if d_model <= 0 or d_model % 2:
        raise CLIError(f"--d-model: expected a positive even integer (sine/cosine pairs), got {d_model}")
    if max_len * d_model > 4_000_000:
        raise CLIError(f"--max-len × --d-model: expected at most 4,000,000 cells, got {max_len * d_model:,}")
    out = prepare_output(out, "--out")

    from headwise.reference import sinusoidal_table
    from headwise.viz.positional import plot_positional_encoding

    table = sinusoidal_table(max_len, d_model)  # (max_len, D)
    try:
        picture = plot_positional_encoding(table, out)
    except OSError as e:
        raise write_failed("--out", out, e) from None
    typer.echo(
        f"wrote {picture.path} ({picture.width}×{picture.height} px): sinusoidal positional encoding, "
        f"{max_len} positions × {d_model} dimensions"
    )
