"""``headwise size``: attention parameters, totals and KV-cache sizes of real architectures.

A thin layer over :mod:`headwise.sizing`: it parses, calls, and prints rich tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from headwise.cli._app import CLIError, app
from headwise.cli._output import table_console

_SEQ_HELP = "Cached positions per sequence (default: the model's context length)."


@app.command()
def size(
    name: Annotated[
        str | None, typer.Argument(help="An architecture, e.g. llama-3-8b (see --all for the list).")
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", help="Read a Hugging Face config.json (or a GGUF file's metadata) instead of a name."),
    ] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="One row per built-in architecture (the article's table).")
    ] = False,
    seq_len: Annotated[int | None, typer.Option("--seq-len", help=_SEQ_HELP)] = None,
    batch: Annotated[int | None, typer.Option("--batch", help="Sequences in the batch (default 1).")] = None,
    dtype: Annotated[
        str | None, typer.Option("--dtype", help="KV-cache element type: bf16|fp16|fp32|int8 (default bf16).")
    ] = None,
    memory: Annotated[
        bool, typer.Option("--memory", help="Plan a run layer by layer: time and peak memory (8B, 70B or NAME).")
    ] = False,
) -> None:
    """Attention parameters (Q, K, V, O), their share of the model, and the KV cache, GQA vs MHA."""
    from headwise import sizing

    console = table_console()  # files and pipes: wide enough that no number is cut
    if memory:  # --seq-len: the tokens of a pass; --batch: the passes timed across machines
        return _memory(console, sizing, name, config, all_, seq_len, batch)
    given = [flag for flag, value in (("NAME", name), ("--config", config), ("--all", all_ or None)) if value]
    if len(given) != 1:
        raise CLIError(
            "give one of an architecture NAME, --config config.json or --all"
            + (f"; got {' and '.join(given)}" if given else "")
        )
    if all_:
        extra = [f for f, v in (("--seq-len", seq_len), ("--batch", batch), ("--dtype", dtype)) if v is not None]
        if extra:
            raise CLIError(f"{', '.join(extra)} apply to one model, not to --all")
        _print_all(console, sizing)
        return
    dtype = "bf16" if dtype is None else dtype
    if dtype not in sizing.DTYPE_BYTES:  # refuse a bad option before printing anything
        raise CLIError(f"--dtype: expected one of {'|'.join(sizing.DTYPE_BYTES)}, got {dtype!r}")
    for option, value in (("--seq-len", seq_len), ("--batch", batch)):
        if value is not None and value <= 0:
            raise CLIError(f"{option}: expected a positive integer, got {value}")
    if config is not None and not config.is_file() and not (config / "config.json").is_file():
        raise CLIError(f"--config: no such file: '{config}' (expected a Hugging Face config.json or a GGUF file)")
    arch = sizing.from_hf_config(config) if config is not None else sizing.get_arch(name)
    seq = arch.max_positions if seq_len is None else seq_len
    sizing.kv_cache_bytes(arch, seq, 1 if batch is None else batch, dtype)  # checks seq_len and batch
    _print_one(console, sizing, arch, seq, 1 if batch is None else batch, dtype, from_registry=config is None)


def _kinds(arch) -> list[str]:
    """The attention kinds and the FFN kind of ``arch`` beyond plain MHA/GQA, in words."""
    kinds = []
    if arch.sliding_window:
        where = f"{arch.sliding_layers} of {arch.num_layers} layers" if arch.global_layers else "every layer"
        kinds.append(f"sliding window {arch.sliding_window} on {where}")
    if arch.qk_norm:
        kinds.append("QK-norm " + ("per head" if arch.qk_norm == "head" else "over the whole projections"))
    if arch.attention_sinks:
        kinds.append("a learned sink logit per head")
    if arch.num_experts:
        shared = f" + {arch.shared_experts} shared" if arch.shared_experts else ""
        dense = f", first {arch.dense_layers} layers dense" if arch.dense_layers else ""
        kinds.append(f"{arch.num_experts} experts{shared}, {arch.experts_per_token} per token{dense}")
    return kinds


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _print_all(console, sizing) -> None:
    from rich.table import Table

    from headwise.articles import size_note
    from headwise.sizing.units import format_count

    table = Table(title="MHA parameter count in real models (computed from each architecture)")
    for header in ("model", "d_model", "layers", "heads", "KV heads", "attention", "total", "share"):
        table.add_column(header, justify="left" if header == "model" else "right", no_wrap=True)
    table.add_column("vs published", justify="right", no_wrap=True)
    table.add_column("note", no_wrap=True)
    footnotes = []
    for arch in sizing.load_architectures():
        attention, total = sizing.attention_params(arch).total, sizing.total_params(arch)
        published = f"{100 * (total / arch.published_total - 1):+.3f}%" if arch.published_total else "—"
        short, full = size_note(arch.name)
        if full and "OFF" in short:
            footnotes.append(f"[{len(footnotes) + 1}] {arch.name}: {full}")
            short += f" [{len(footnotes)}]"
        table.add_row(
            arch.name,
            str(arch.hidden_size),
            str(arch.num_layers),
            str(arch.num_heads),
            str(arch.num_kv_heads),
            format_count(attention),
            format_count(total),
            _pct(attention / total),
            published,
            short,
        )
    console.print(table)
    archs = sizing.load_architectures()
    gqa = [a.name for a in archs if a.num_kv_heads != a.num_heads]
    wide = [
        f"{a.name} ({a.num_heads}·{a.head_dim} = {a.num_heads * a.head_dim} ≠ {a.hidden_size})"
        for a in archs
        if a.num_heads * a.head_dim != a.hidden_size
    ]
    console.print(
        "attention = W_Q, W_K, W_V, W_O with their biases, over all layers; share = attention / total; "
        "'vs published' = computed total against the published figure (sources in the data file). "
        "The article's 4·d_model² per layer holds only for plain MHA with heads·head_dim = d_model: "
        f"GQA shrinks W_K and W_V by heads / KV heads ({', '.join(gqa) or 'none here'})"
        + (f", and heads·head_dim differs from d_model in {', '.join(wide)}." if wide else "."),
        highlight=False,
    )
    for note in footnotes:
        console.print(note, highlight=False)


def _print_one(console, sizing, arch, seq_len: int, batch: int, dtype: str, *, from_registry: bool) -> None:
    """One architecture: what it is, its attention's parameters, all its parameters, its KV cache, its notes."""
    from headwise.articles import size_note

    _print_description(console, arch)
    _print_attention(console, sizing, arch)
    _print_parameters(console, sizing, arch)
    _print_kv_cache(console, sizing, arch, seq_len, batch, dtype)
    if arch.notes:
        console.print(f"note: {arch.notes}", highlight=False)
    _, full = size_note(arch.name) if from_registry else ("", "")
    if full:
        console.print(f"note: {full}", highlight=False)


def _print_description(console, arch) -> None:
    """Its name, kind and heads; its widths, FFN, vocabulary, context and norm; its attention kinds; its source."""
    n = arch.num_layers
    variant = arch.attention_variant
    if variant == "MLA":
        heads = (
            f"{arch.num_heads} heads read keys and values from a {arch.kv_lora_rank}-wide latent and a "
            f"{arch.qk_rope_head_dim}-wide rotary key shared by all heads"
        )
    elif variant == "MHA":
        heads = f"{arch.num_heads} heads"
    else:
        heads = f"{arch.num_heads} query heads share {arch.num_kv_heads} key/value heads ({arch.group_size} per group)"
    ffn = "gated, 3 matrices" if arch.ffn == "gated" else "2 matrices"
    console.print(f"[bold]{arch.name}[/bold] — {arch.kind}, {variant}: {heads}", highlight=False)
    console.print(
        f"d_model {arch.hidden_size} · {n} layers · head_dim {arch.head_dim} · FFN {arch.intermediate_size} "
        f"({ffn}{', ' + arch.activation if arch.activation else ''}) · vocab {arch.vocab_size} · "
        f"context {arch.max_positions} · {arch.norm}",
        highlight=False,
    )
    kinds = _kinds(arch)
    if kinds:
        console.print(" · ".join(kinds), highlight=False)
    if arch.source:
        console.print(f"source: {arch.source}", highlight=False)


def _print_attention(console, sizing, arch) -> None:
    """The attention parameters' table: each projection's shape, bias and count, per layer and over all layers."""
    from rich.table import Table

    from headwise.sizing.units import format_count

    att = sizing.attention_params(arch)
    n = arch.num_layers
    variant = arch.attention_variant
    qdim, kvdim = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    table = Table(title="Attention parameters (weights + biases)")
    table.add_column("projection")
    table.add_column("shape (in → out)", justify="right")
    table.add_column("bias")
    table.add_column("per layer", justify="right")
    table.add_column(f"all {n} layers", justify="right")
    d, h, dv = arch.hidden_size, arch.num_heads, arch.value_head_dim
    if variant == "MLA":
        r, dr, rq = arch.kv_lora_rank, arch.qk_rope_head_dim, arch.q_lora_rank
        rows = (
            ("W_Q", f"{d} → {rq} → {qdim}" if rq else f"{d} → {qdim}", arch.qkv_bias, att.q),
            ("W_K (latent, rope key, W_UK)", f"{d} → {r}+{dr}, {r} → {h * (arch.head_dim - dr)}", arch.qkv_bias, att.k),
            ("W_V (W_UV)", f"{r} → {h * dv}", False, att.v),
            ("W_O", f"{h * dv} → {d}", arch.o_bias, att.o),
        )
    else:
        rows = (
            ("W_Q", f"{d} → {qdim}", arch.qkv_bias, att.q),
            ("W_K", f"{d} → {kvdim}", arch.qkv_bias, att.k),
            ("W_V", f"{d} → {kvdim}", arch.qkv_bias, att.v),
            ("W_O", f"{qdim} → {d}", arch.o_bias, att.o),
        )
    if att.extra:
        rows += (("QK-norm, sinks", "", False, att.extra),)
    for label, shape, bias, count in rows:
        table.add_row(label, shape, "yes" if bias else "no", f"{count:,}", f"{count * n:,}")
    table.add_row("total", "", "", f"{att.per_layer:,}", f"{att.total:,} ({format_count(att.total)})", style="bold")
    console.print(table)


def _print_parameters(console, sizing, arch) -> None:
    """All parameters by part with their shares, and the computed total against the published one."""
    from rich.table import Table

    from headwise.sizing.units import format_count

    parts = sizing.param_breakdown(arch)
    total = parts.total
    table = Table(title="All parameters")
    table.add_column("part")
    table.add_column("parameters", justify="right")
    table.add_column("share", justify="right")
    for label, count in (
        ("attention (Q, K, V, O)", parts.attention),
        ("feed-forward", parts.ffn),
        ("embeddings" + (" (+ positions)" if arch.learned_positions else ""), parts.embeddings),
        ("norms", parts.layer_norms + parts.final_norm),
        ("pooler", parts.pooler),
        ("output head" + (" (tied: counted in embeddings)" if arch.output_head == "tied" else ""), parts.output_head),
    ):
        if count or label.startswith("output head (tied"):
            table.add_row(label, f"{count:,}", _pct(count / total))
    table.add_row("total", f"{total:,} ({format_count(total)})", "100.0%", style="bold")
    console.print(table)
    if arch.published_total:
        console.print(
            f"published: {arch.published_text or format_count(arch.published_total)} — "
            f"{arch.published_source} — computed {total:,}: "
            f"{100 * (total / arch.published_total - 1):+.3f}%",
            highlight=False,
        )


def _print_kv_cache(console, sizing, arch, seq_len: int, batch: int, dtype: str) -> None:
    """The KV cache of the same heads and layers under each kind of attention, and what this one saves."""
    from rich.table import Table

    from headwise.sizing.units import format_bytes, format_count

    variant = arch.attention_variant
    rows = sizing.kv_cache_variants(arch, seq_len, batch, dtype)
    table = Table(
        title=f"KV cache ({dtype}, seq_len {seq_len} × batch {batch}): the same heads and layers, other kinds"
    )
    table.add_column("attention")
    table.add_column("cached per layer and position")
    table.add_column("per token", justify="right")
    table.add_column(f"{seq_len} × {batch}", justify="right")
    table.add_column("source")
    for row in rows:
        table.add_row(
            f"{row.name} ({arch.name})" if row.own else row.name,
            row.shape,
            f"{row.per_token:,} B",
            f"{row.total:,} B ({format_bytes(row.total)})",
            row.source,
            style="bold" if row.own else None,
        )
    console.print(table)
    console.print(
        "per token = what one more position adds while every layer still grows: 2 (K and V) × KV heads × "
        "head_dim, or latent + rope key for MLA, × layers × bytes per element. A windowed layer stops growing "
        "at its window (a ring buffer).",
        highlight=False,
    )
    own = next(row for row in rows if row.own)
    mha = rows[0]
    if not mha.own:
        console.print(
            f"{own.name} saving: {mha.total / own.total:.3g}× smaller cache than MHA at {seq_len} × {batch} "
            f"({format_bytes(mha.total - own.total)} less).",
            highlight=False,
        )
        if variant in ("GQA", "MQA"):
            fewer = sizing.attention_params(sizing.as_mha(arch)).total - sizing.attention_params(arch).total
            console.print(
                f"{variant} also has {format_count(fewer)} fewer attention parameters than MHA.", highlight=False
            )
    else:
        console.print("plain MHA: num_kv_heads = num_heads, so there is no GQA saving.", highlight=False)
    if arch.kind == "encoder":
        console.print(
            "an encoder keeps no KV cache while it runs; the figures say what one would hold.", highlight=False
        )


def _memory(console, sizing, name, config, all_, seq_len, batch) -> None:
    from rich.table import Table

    from headwise.sizing.layers import DEFAULT_MODELS, planning_table

    if all_:
        raise CLIError("--memory: plans NAME, --config or the default 8B and 70B models, not --all")
    for option, value in (("--seq-len", seq_len), ("--batch", batch)):
        if value is not None and value <= 0:
            raise CLIError(f"{option}: expected a positive integer, got {value}")
    archs = [sizing.from_hf_config(config) if config else sizing.get_arch(name)] if name or config else [
        sizing.get_arch(m) for m in DEFAULT_MODELS]  # fmt: skip
    title, headers, rows, note = planning_table(archs, tokens=seq_len or 512, batches=batch or 32)
    runs = [_last_runs(arch) for arch in archs]
    table = Table(title=title, header_style="bold")
    for h in headers:
        table.add_column(h, justify="left" if h == "model" else "right")
    for row, ran in zip(rows, runs):
        table.add_row(f"{row[0]}\n({'run here' if ran else 'extrapolated'})", *row[1:])
    console.print(table)
    console.print(note)
    ran = [(arch, run) for arch, got in zip(archs, runs) for run in got]
    if ran:
        runs_table = Table(title="run here: the last run of each command on a model of that size", header_style="bold")
        for h in ("model", "command", "peak", "budget", "seconds", "run", "CPU"):
            runs_table.add_column(h, justify="right" if h in ("peak", "budget", "seconds") else "left")
        for arch, run in ran:
            peak, budget = f"{run['peak'] / 1e9:.2f} GB", f"{run['budget'] / 1e9:.2f} GB"
            runs_table.add_row(arch.name, run["command"], peak, budget, f"{run['seconds']:.0f} s",
                               f"{run['model']}, {run['written']}", run["cpu"])  # fmt: skip
        console.print(runs_table)
    from headwise.models.runs import runs_path

    console.print(f"run here: a command run layer by layer on this machine on a model of that size ({runs_path()}); "
                  "extrapolated: arithmetic on the rates measured now, not run.")  # fmt: skip


def _last_runs(arch) -> list[dict]:
    """The last recorded run of each command on a model of ``arch``'s parameter count
    (:func:`headwise.models.runs.recorded_runs`)."""
    from headwise.models.runs import recorded_runs
    from headwise.sizing.count import total_params

    last: dict[str, dict] = {}
    for run in recorded_runs(total_params(arch)):
        last[run["command"]] = run
    return list(last.values())
