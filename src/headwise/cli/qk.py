"""``headwise qk``: why a head attends where it does — its score split into query-side × key-side parts.

``headwise qk --model M --text T --head L.H --query I [--key J] --out DIR [--top N]``

The score of head ``L.H`` at query position I and key position J (default: the key the head weights most) is
split into the terms ``q_a(I) · k_b(J) · scale`` over what wrote the residual stream at I and at J — the
embeddings, every earlier head, each output projection's bias, every MLP, the norm's and the projection's
biases — with the norms' scales frozen from the run, QK-norm and RoPE applied to each part
(:func:`headwise.circuits.qk_attribution`). The terms add up to the score the model used (before a
soft-cap). Positions count tokens as the model reads them (a BOS token is position 0); a negative
position counts from the end (−1: the last token).

Prints the largest terms as a table (tokens as text) and writes into ``--out`` (the folder appears whole or
not at all): ``qk.json`` (the row's keys, tokens, scores and weights; per part its term, centred term and
effect on the weight at J; the top terms as the circuit page shows them) and ``qk.png`` (the matrix of the
largest parts, beside the row's weights).

A model opened layer by layer (``--max-memory`` below its float32 size) streams the one forward pass, then reads one
layer's weights at a time (:func:`headwise.circuits.qk.qk_attribution`): the same qk.json.

Bad input — a head or position out of range, a key the query cannot see, an empty text, a budget too small for
one layer's weights and what the attribution keeps of the run (naming the memory it needs) — is one line on stderr
and exit status 2, before anything is written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from headwise.cli._app import app
from headwise.cli._output import write_failed

OUTPUTS = ("qk.json", "qk.png")


@app.command()
def qk(
    model: Annotated[str, typer.Option("--model", help="A decoder: a model folder, a GGUF file, or 'smollm2'.")],
    text: Annotated[str, typer.Option("--text", help="The text the model reads.")],
    head: Annotated[str, typer.Option("--head", help="LAYER.HEAD, e.g. 3.1.")],
    query: Annotated[int, typer.Option("--query", help="The query position (−1: the last token).")],
    out: Annotated[Path, typer.Option("--out", help="Folder for qk.json and qk.png.")],
    key: Annotated[
        int | None, typer.Option("--key", help="The key position (default: the key the head weights most).")
    ] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="Terms printed and parts pictured per side.")] = 12,
    max_memory: Annotated[
        str | None, typer.Option("--max-memory", help="Peak memory budget: 1.5GB, 400MB (default 80% free).")
    ] = None,
) -> None:
    """Split one head's attention score into what wrote its query and its key."""
    from rich.console import Console
    from rich.table import Table

    from headwise._io import atomic_folder, write_text_atomic
    from headwise.commands import qk as flow
    from headwise.viz.qk import plot_qk

    options = flow.QkOptions(
        model=model, text=text, head=head, query=query, out=out, key=key, top=top, max_memory=max_memory
    )
    got = flow.run(options)
    hm, result, layer, h, i, tokens = got.hm, got.attribution, got.layer, got.head, got.query, got.tokens
    c = result.key_index()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_folder(out) as folder:
            write_text_atomic(folder / "qk.json", json.dumps(got.report, indent=1, ensure_ascii=False) + "\n")
            plot_qk(result, folder / "qk.png", top=top, title=f"{hm.title}: L{layer}.H{h}")
    except OSError as e:
        raise write_failed("--out", out, e) from None

    console = Console(highlight=False)
    console.print(f"[bold]{hm.title}[/] — head L{layer}.H{h} (key/value group {result.group})")
    console.print(
        f"query {i} {tokens[i]!r} → key {result.key} {tokens[result.key]!r}: score {float(result.scores[c]):+.4f}"
        + ("" if result.softcap is None else f" (capped {float(result.logits[c]):+.4f})")
        + f", weight {float(result.weights[c]):.3f}; {len(result.query_labels)} × {len(result.key_labels)} terms"
    )
    table = Table(title=f"the {top} largest terms q_a · k_b · scale", title_justify="left")
    for name, justify in (("query-side part", "left"), ("key-side part", "left"), ("term", "right")):
        table.add_column(name, justify=justify)
    for a, b, v in result.top_terms(top):
        table.add_row(_part(a, tokens, i), _part(b, tokens, result.key), f"{v:+.4f}")
    console.print(table)
    console.print(f"wrote {', '.join(OUTPUTS)} to {out}")


def _part(label: str, tokens: list[str], position: int) -> str:
    """A part's name, the embedding's with the token it embeds."""
    return f"embed {tokens[position]!r}" if label == "embed" else label
