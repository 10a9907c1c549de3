"""``headwise heads``: what every attention head of a model does, on a sentence or over a corpus.

``headwise heads [TEXT] [--corpus FILE] [--model DIR] [--layer N] [--out DIR]`` prints a layer × head
table of the metrics of :mod:`headwise.analysis` (Clark et al. 2019, Voita et al. 2019) and each head's
role, and writes into ``--out`` (default ``headwise-out/heads``), each file atomically:

- ``heads.json`` and ``heads.csv`` — every metric of every head (JSON adds the head-to-head
  Jensen–Shannon distances);
- ``heads.png`` — the example sentence's attention, a layer × head grid of heatmaps;
- ``roles.png`` — one layer × head heatmap per metric, the role map and the MDS map of the heads;
- ``headview.html`` — the self-contained, offline head view of the example sentence.

The statistics are those of ``--corpus`` when given (``--corpus sample``: the bundled 1,200
public-domain sentences), else of TEXT alone. The example sentence is TEXT, else the corpus's first line.
``--model``: a BERT checkpoint folder (default: the bundled all-MiniLM-L6-v2), or ``untrained`` for the
first article's randomly initialised ``AttentionBlock`` (one layer, 4 heads, D = 128, seed 0, on the
bundled model's WordPiece tokens).

What happens with bad input: an empty TEXT, an empty corpus, a missing or corrupt checkpoint, an
unknown ``--layer`` → one line on stderr, exit status 2. Corpus lines that are not valid UTF-8 are
skipped and counted (a warning says how many and where the first was). A text longer than the model's
512 positions is truncated to its first 512 tokens, with a warning.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated

import typer

from headwise.cli._app import CLIError, app
from headwise.cli._output import prepare_folder, write_failed
from headwise.cli._progress import corpus_progress

#: The untrained block of the first article: sizes and seed.
UNTRAINED = {"d_model": 128, "num_heads": 4, "seed": 0}
#: Columns of the printed table: (metric, header, format).
COLUMNS = (
    ("cls", "[CLS]", "{:.2f}"),
    ("sep", "[SEP]", "{:.2f}"),
    ("punct", ". ,", "{:.2f}"),
    ("self", "self", "{:.2f}"),
    ("prev", "prev", "{:.2f}"),
    ("next", "next", "{:.2f}"),
    ("entropy", "H nats", "{:.2f}"),
    ("entropy_cls", "H[CLS]", "{:.2f}"),
    ("entropy_ratio", "H/ln n", "{:.2f}"),
    ("distance", "dist", "{:.1f}"),
    ("confidence", "conf", "{:.2f}"),
)


def _warn(message: str) -> None:
    import sys

    print(f"headwise: warning: {' '.join(message.split())}", file=sys.stderr)


def _sample_corpus() -> Path:
    from importlib import resources

    return Path(str(resources.files("headwise") / "data" / "corpus" / "web_sentences.txt"))


def load_model(model: str | None):
    """``(attend, num_layers, num_heads, max_length, title)`` for ``--model`` (None, a folder, or ``untrained``).

    Raises:
        CLIError: the checkpoint cannot be loaded (missing, corrupt, wrong shapes …), naming the file.
    """
    from headwise import models

    try:
        if model == "untrained":
            import torch

            from headwise.core.block import AttentionBlock

            _, tokenizer = models.load_bert()
            torch.manual_seed(UNTRAINED["seed"])
            block = AttentionBlock(tokenizer.get_vocab_size(), UNTRAINED["d_model"], UNTRAINED["num_heads"]).eval()

            def run(ids, padding):
                return block(ids, key_padding_mask=padding, need_weights=True, average_weights=False)[1]

            title = f"untrained AttentionBlock (D={UNTRAINED['d_model']}, H={UNTRAINED['num_heads']}, seed 0)"
            return models.block_attend(run, tokenizer, max_length=512), 1, UNTRAINED["num_heads"], 512, title
        bert, tokenizer = models.load_bert(model)
    except (FileNotFoundError, ValueError) as e:
        raise CLIError(f"--model: {e}") from None
    c = bert.config
    name = "all-MiniLM-L6-v2" if model is None else Path(model).name
    title = f"{name} ({c.num_hidden_layers} layers × {c.num_attention_heads} heads)"
    attend = models.model_attend(bert, tokenizer)
    return attend, c.num_hidden_layers, c.num_attention_heads, c.max_position_embeddings, title


def print_head_table(console, report, *, layer: int | None = None, title: str = "") -> None:
    """Print a layer × head table of ``report`` (a :class:`~headwise.analysis.HeadReport`) with rich.

    Args:
        console: a ``rich.console.Console``.
        report: the report.
        layer: only this layer's heads.
        title: the table's caption line.
    """
    from rich.table import Table

    table = Table(title=title or None, header_style="bold", show_lines=False, pad_edge=False)
    table.add_column("L", justify="right")
    table.add_column("H", justify="right")
    table.add_column("role")
    for _, header, _ in COLUMNS:
        table.add_column(header, justify="right")
    table.add_column("pos", justify="right")
    styles = {"broad": "magenta", "other": "dim"}
    layers = range(report.num_layers) if layer is None else [layer]
    for lay in layers:
        for h in range(report.num_heads):
            role = str(report.roles[lay, h])
            cells = []
            for metric, _, fmt in COLUMNS:
                v = float(report.metrics[metric][lay, h])
                cells.append("–" if v != v else fmt.format(v))
            share = float(report.metrics["positional_share"][lay, h])
            offset = int(report.metrics["positional_offset"][lay, h])
            pos = f"{offset:+d}" if report.positional[lay, h] else ("–" if share != share else f"({share:.0%})")
            table.add_row(str(lay), str(h), f"[{styles.get(role, 'bold cyan')}]{role}[/]", *cells, pos)
        if layer is None and lay < report.num_layers - 1:
            table.add_section()
    console.print(table)


def _analyze_corpus(corpus: Path, attend, num_layers, num_heads, max_length, batch_size):
    from headwise import analysis
    from headwise.models import TruncationWarning

    reader = analysis.CorpusFile(corpus)
    total = reader.count()
    if total == 0:  # one line: the error says what was skipped
        skipped = f" ({reader.num_undecodable} undecodable line(s) skipped)" if reader.num_undecodable else ""
        raise CLIError(f"--corpus: no non-empty UTF-8 line in '{corpus}'{skipped}")
    if reader.num_undecodable:
        where = ", ".join(map(str, reader.undecodable[:5]))
        _warn(
            f"--corpus: skipped {reader.num_undecodable} line(s) that are not valid UTF-8 "
            f"(line {where}{' …' if reader.num_undecodable > 5 else ''})"
        )
    with warnings.catch_warnings(record=True) as caught, corpus_progress(total) as progress:
        warnings.simplefilter("always", TruncationWarning)
        report = analysis.analyze_texts(
            reader,
            attend,
            num_layers=num_layers,
            num_heads=num_heads,
            max_length=max_length,
            batch_size=batch_size,
            progress=progress,
        )
    cut = [w for w in caught if issubclass(w.category, TruncationWarning)]
    if cut:
        _warn(f"--corpus: {len(cut)} line(s) longer than {max_length} tokens were truncated to {max_length}")
    for w in caught:
        if not issubclass(w.category, TruncationWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return report, reader, total


@app.command()
def heads(
    text: Annotated[
        str | None, typer.Argument(help="A sentence (the example drawn; its statistics without --corpus).")
    ] = None,
    corpus: Annotated[
        str | None,
        typer.Option("--corpus", help="UTF-8 text file, one sentence per line, or 'sample' (bundled, 1,200 lines)."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="BERT checkpoint folder (default: bundled all-MiniLM-L6-v2) or 'untrained'."),
    ] = None,
    layer: Annotated[int | None, typer.Option("--layer", help="Show only this layer (0-based).")] = None,
    out: Annotated[Path, typer.Option("--out", help="Output folder.")] = Path("headwise-out/heads"),
    batch_size: Annotated[int, typer.Option("--batch-size", help="Corpus sentences per model call.", min=1)] = 32,
) -> None:
    """Per-head statistics and roles: a table, JSON, CSV, pictures and an offline head view.

    The metrics of Clark et al. 2019 and Voita et al. 2019, over TEXT or a corpus (see headwise.analysis).
    """
    from rich.console import Console

    if text is not None and not text.strip():
        raise CLIError("TEXT: expected a non-empty text, got an empty one")
    if text is None and corpus is None:
        raise CLIError("expected a TEXT or --corpus FILE (or --corpus sample for the bundled sentences)")
    corpus_path = None
    if corpus is not None:
        corpus_path = _sample_corpus() if corpus == "sample" else Path(corpus)
        if not corpus_path.exists():
            raise CLIError(f"--corpus: no such file: '{corpus_path}'")
        if corpus_path.is_dir():
            raise CLIError(f"--corpus: '{corpus_path}' is a folder; expected a text file")
    prepare_folder(out, "--out")

    from headwise import analysis
    from headwise.models import TruncationWarning
    from headwise.viz.report import write_heads_outputs

    attend, num_layers, num_heads, max_length, title = load_model(model)
    if layer is not None and not 0 <= layer < num_layers:
        raise CLIError(f"--layer: expected 0 … {num_layers - 1} for this model, got {layer}")

    extra = {"model": title}
    report = None
    if corpus_path is not None:
        report, reader, total = _analyze_corpus(corpus_path, attend, num_layers, num_heads, max_length, batch_size)
        extra["corpus"] = {
            "path": str(corpus_path),
            "sentences": report.num_sentences,
            "skipped_undecodable": reader.num_undecodable,
            "skipped_blank": reader.num_blank,
        }
        if text is None:
            text = next(iter(reader))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TruncationWarning)
        sentence = analysis.analyze_sentence(
            text, attend, num_layers=num_layers, num_heads=num_heads, max_length=max_length
        )
    for w in caught:
        if issubclass(w.category, TruncationWarning):
            _warn(f"TEXT: {str(w.message).split(': ', 1)[-1]}")
    report = report or sentence.report
    extra["sentence"] = {"text": text, "tokens": sentence.tokens}

    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
        console = Console(width=140)
    scope = f"{report.num_sentences} sentences of {corpus_path.name}" if corpus_path is not None else "this sentence"
    print_head_table(console, report, layer=layer, title=f"{title} — {scope}, {report.num_tokens} tokens")
    counts = {}
    for r in report.roles.ravel():
        counts[str(r)] = counts.get(str(r), 0) + 1
    console.print("roles: " + ", ".join(f"{r} {k}" for r, k in sorted(counts.items(), key=lambda x: -x[1])))
    console.print(
        "pos: Voita's positional test (argmax at one offset for ≥ 90% of tokens: the offset, else the share); "
        f"ln n = {float(report.metrics['uniform_entropy'][0, 0]):.2f} nats on average"
    )
    try:
        paths = write_heads_outputs(sentence, report, out, layer=layer, title=title, extra=extra)
    except OSError as e:
        raise write_failed("--out", out, e) from None
    console.print("wrote " + ", ".join(str(p) for p in paths.values()))
