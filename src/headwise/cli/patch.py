"""``headwise patch``: which heads carry an answer — activation patching per head and direct logit attribution.

``headwise patch --model DIR --clean TEXT --corrupted TEXT --answer TOKEN --wrong TOKEN --out DIR
[--method exact|attribution] [--direction denoise|noise] [--head L.H ...] [--batch-size N]``

The metric is logit(answer) − logit(wrong) at the last position. ``--method exact`` (default) runs the
corrupted text once per head with that head's output taken from the clean run (``--direction denoise``; or the
clean text with the corrupted head, ``noise``), batched; ``attribution`` estimates the same sweep from one
forward and one backward pass (:mod:`headwise.patching`). ``--head 23.3`` (repeatable) also patches that head
one position at a time. The direct logit attribution of both texts (each head's, MLP's and the embeddings'
share of the logit difference, the final norm's scale frozen) comes in the same files.

Writes into ``--out`` (the folder appears whole or not at all): ``patching.json`` (the ids, both metrics, the
patched metric and its normalised effect per layer and head, the attribution), ``patching.csv`` (one row per
part) and ``patching.png`` (the layer × head maps).

Under ``torchrun --nproc-per-node P -m headwise patch …`` the exact sweep's batches are dealt to the ranks
(:func:`headwise.study.patch_across_ranks`): rank 0 writes the same files as one process (the same batches, so the
same numbers) and ``--out/shards`` keeps each batch's values, so a restarted or repeated run with the same options
computes only what is missing. ``--method attribution`` runs on rank 0 alone. See ``docs/distributed.md``.

``--model``: a model folder, a GGUF file or a bundled name (``smollm2``) that :func:`headwise.models.open_model`
opens and that is a decoder (a Hugging Face causal LM on headwise's backend, a lab checkpoint). ``TOKEN`` must
encode to exactly one token, as typed (for byte-level BPE, " Mary" with its leading space is one token). Bad
input — texts of different token lengths, an answer or wrong token of several tokens or unknown, identical
answer and wrong tokens, a ``--head`` out of range
— is one line on stderr and exit status 2, before anything is written.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
from pathlib import Path
from typing import Annotated

import typer

from headwise.checks import head_number, layer_number
from headwise.cli._app import CLIError, app
from headwise.cli._decoder import encode_text, encode_token, open_decoder
from headwise.cli._output import write_failed
from headwise.cli._progress import stage_progress
from headwise.distributed.ranks import first_rank, launched

METHODS = ("exact", "attribution")
DIRECTIONS = ("denoise", "noise")
OUTPUTS = ("patching.json", "patching.csv", "patching.png")


def parse_heads(target, specs: list[str]) -> list[tuple[int, int]]:
    """``["23.3", …]`` as checked ``(layer, head)`` pairs."""
    heads = []
    for spec in specs:
        parts = spec.split(".")
        if len(parts) != 2 or not all(p.strip().lstrip("-").isdigit() for p in parts):
            raise CLIError(f"--head: expected LAYER.HEAD (e.g. 23.3), got {spec!r}")
        layer, head = int(parts[0]), int(parts[1])
        try:
            layer_number("--head", layer, target.num_layers, subject=f"layer {layer} in {spec!r}")
            head_number("--head", head, layer, target.heads_per_layer[layer], subject=f"head {head} in {spec!r}")
        except ValueError as e:
            raise CLIError(str(e)) from None
        heads.append((layer, head))
    return heads


def _number(x: float) -> float | None:
    return None if x is None or math.isnan(x) else round(float(x), 6)


def _grid(values) -> list[list[float | None]]:
    return [[_number(v) for v in row] for row in values.tolist()]


def _across_ranks(hm, c, x, metric, chosen, direction: str, batch_size: int, out: Path, progress):
    """Under torchrun: every rank patches its share of the sweep's batches (:func:`headwise.study.patch_across_ranks`,
    resumable from ``--out``'s shards). Rank 0 gets ``(Patching, positions (K, L) or None)``, the others
    ``(None, None)``."""
    from headwise import study

    shown = None if progress is None else (lambda done, total: progress("batches of rank 0", done, total))
    try:
        run = study.patch_across_ranks(
            hm, c, x, metric, heads=chosen, direction=direction, batch_size=batch_size, out=out, progress=shown
        )
    except study.CollectiveTimeout as e:
        raise CLIError(str(e)) from None
    if run.patching is None:
        return None, None
    typer.echo(
        f"{run.world_size} ranks; rank 0: {len(run.computed)} batch(es) computed, {len(run.resumed)} resumed from "
        f"{out / 'shards'}; {run.payload_bytes} bytes gathered"
    )
    return run.patching, None if run.positions is None else run.positions[0]


def _dla_json(dla) -> dict:
    return {
        "heads": _grid(dla.heads.mean(0)),
        "attention_bias": [_number(v) for v in dla.head_bias.mean(0).tolist()],
        "mlp": [_number(v) for v in dla.mlp.mean(0).tolist()],
        "embed": _number(float(dla.embed.mean())),
        "final_norm_bias": _number(float(dla.norm_bias.mean())),
        "unembed_bias": _number(float(dla.unembed_bias.mean())),
        "total": _number(float(dla.total.mean())),
        "unembed_difference": _number(float(dla.unembed_difference.mean())),
        "logit_difference": _number(float(dla.logit_difference.mean())),
    }


def _csv(result, dla: dict) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["part", "layer", "head", "patched", "normalised", "dla_clean", "dla_corrupted"])
    patched, normalised = result.mean_patched, result.normalised
    clean, corrupted = dla.get("clean"), dla.get("corrupted")
    for layer in range(patched.shape[0]):
        for head in range(patched.shape[1]):
            if math.isnan(float(patched[layer, head])):
                continue
            writer.writerow(
                [
                    "head",
                    layer,
                    head,
                    _number(float(patched[layer, head])),
                    _number(float(normalised[layer, head])),
                    clean["heads"][layer][head] if clean else "",
                    corrupted["heads"][layer][head] if corrupted else "",
                ]
            )
    if clean and corrupted:
        for layer in range(patched.shape[0]):
            for part, key in (("attention_bias", "attention_bias"), ("mlp", "mlp")):
                writer.writerow([part, layer, "", "", "", clean[key][layer], corrupted[key][layer]])
        for part in ("embed", "final_norm_bias", "unembed_bias", "total", "logit_difference"):
            writer.writerow([part, "", "", "", "", clean[part], corrupted[part]])
    return buf.getvalue()


@app.command()
def patch(
    model: Annotated[
        str,
        typer.Option("--model", help="A decoder: a model folder, a GGUF file, or 'smollm2' (as headwise heads)."),
    ],
    clean: Annotated[str, typer.Option("--clean", help="The clean text (the answer is right).")],
    corrupted: Annotated[str, typer.Option("--corrupted", help="The corrupted text, of the same token length.")],
    answer: Annotated[str, typer.Option("--answer", help="The answer token, as typed (e.g. ' Mary').")],
    wrong: Annotated[str, typer.Option("--wrong", help="The wrong token the answer is compared with.")],
    out: Annotated[Path, typer.Option("--out", help="Folder for patching.json / .csv / .png.")],
    method: Annotated[str, typer.Option("--method", help="exact or attribution.")] = "exact",
    direction: Annotated[
        str, typer.Option("--direction", help="denoise (clean head into the corrupted run) or noise.")
    ] = "denoise",
    heads: Annotated[
        list[str] | None, typer.Option("--head", help="LAYER.HEAD also patched one position at a time; repeatable.")
    ] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Patched copies per forward pass.")] = 16,
) -> None:
    """Patch every head (clean ↔ corrupted) and split the logit difference into the parts that write it."""
    import torch

    from headwise._io import atomic_folder, write_text_atomic
    from headwise.patching import (
        as_target,
        attribution_patch,
        direct_logit_attribution,
        logit_difference,
        patch_heads,
        patch_positions,
    )
    from headwise.viz.patching import plot_patching

    if method not in METHODS:
        raise CLIError(f"--method: expected one of {', '.join(METHODS)}, got {method!r}")
    if direction not in DIRECTIONS:
        raise CLIError(f"--direction: expected one of {', '.join(DIRECTIONS)}, got {direction!r}")
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out: '{out}' exists and is not a folder")
    hm = open_decoder(model)
    clean_ids = encode_text(hm, "--clean", clean)
    corrupted_ids = encode_text(hm, "--corrupted", corrupted)
    if len(clean_ids) != len(corrupted_ids):
        raise CLIError(
            f"--corrupted: {len(corrupted_ids)} tokens, but --clean has {len(clean_ids)}; patching swaps the same "
            "positions, so both texts must have the same token length"
        )
    answer_id = encode_token(hm, "--answer", answer)
    wrong_id = encode_token(hm, "--wrong", wrong)
    if answer_id == wrong_id:
        raise CLIError(f"--wrong: {wrong!r} is the same token as --answer {answer!r} (id {answer_id})")
    try:
        target = as_target(hm)
    except ValueError as e:
        raise CLIError(f"--model: {e}") from None
    chosen = parse_heads(target, heads or [])
    metric = logit_difference(answer_id, wrong_id)
    c, x = torch.tensor([clean_ids]), torch.tensor([corrupted_ids])

    across = launched()  # under torchrun: the exact sweep's batches split across ranks
    first = first_rank()
    if across and method != "exact" and not first:
        return  # one forward and one backward pass: rank 0 runs it alone
    with stage_progress() if first else contextlib.nullcontext() as progress:
        if across and method == "exact":
            result, positions = _across_ranks(hm, c, x, metric, chosen, direction, batch_size, out, progress)
            if result is None:  # not rank 0: rank 0 writes
                return
        else:
            if method == "exact":
                result = patch_heads(
                    target,
                    c,
                    x,
                    metric,
                    direction=direction,
                    batch_size=batch_size,
                    progress=lambda done, total: progress("patched alone", done, total),
                )
            else:
                progress("attribution patching", 0, 1)
                result = attribution_patch(target, c, x, metric, direction=direction)
                progress("attribution patching", 1, 1)
            positions = None
            if chosen:
                positions = patch_positions(
                    target,
                    c,
                    x,
                    metric,
                    chosen,
                    direction=direction,
                    batch_size=batch_size,
                    progress=lambda done, total: progress("patched per position", done, total),
                )[0]  # (K, L)
        dla: dict = {}
        notes = []
        try:
            for name, ids in (("clean", c), ("corrupted", x)):
                dla[name] = _dla_json(direct_logit_attribution(target, ids, metric))
        except ValueError as e:
            dla = {}
            notes.append(f"direct logit attribution skipped: {e}")

    clean_m, corrupt_m = float(result.metric_clean.mean()), float(result.metric_corrupted.mean())
    report = {
        "model": hm.name,
        "family": hm.family,
        "method": result.method,
        "direction": direction,
        "metric": "logit(answer) - logit(wrong) at the last position",
        "clean": clean,
        "corrupted": corrupted,
        "clean_ids": clean_ids,
        "corrupted_ids": corrupted_ids,
        "clean_tokens": hm.token_texts(clean_ids),
        "corrupted_tokens": hm.token_texts(corrupted_ids),
        "clean_pieces": hm.token_strings(clean_ids),
        "corrupted_pieces": hm.token_strings(corrupted_ids),
        "answer": {"text": answer, "id": answer_id},
        "wrong": {"text": wrong, "id": wrong_id},
        "metric_clean": _number(clean_m),
        "metric_corrupted": _number(corrupt_m),
        "patched": _grid(result.mean_patched),
        "normalised": _grid(result.normalised),
        "passes": result.passes,
        "seconds": round(result.seconds, 3),
        "forward_seconds": round(result.forward_seconds, 4),
        "logit_attribution": dla or None,
    }
    if result.per_position is not None:
        report["attribution_per_position"] = [_grid(layer) for layer in result.per_position[0]]
    if positions is not None:
        report["positions"] = {
            "heads": [list(h) for h in chosen],
            "patched": _grid(positions),
            "normalised": _grid((positions - corrupt_m) / (clean_m - corrupt_m)) if clean_m != corrupt_m else None,
        }
    if notes:
        report["notes"] = notes
    title = f"{hm.title}: {answer!r} vs {wrong!r}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_folder(out, keep=("shards",) if across else ()) as folder:  # kept: a rerun resumes
            write_text_atomic(folder / "patching.json", json.dumps(report, indent=1, ensure_ascii=False) + "\n")
            write_text_atomic(folder / "patching.csv", _csv(result, dla))
            heads_dla = None
            if dla:
                heads_dla = [[math.nan if v is None else v for v in row] for row in dla["clean"]["heads"]]
            plot_patching(
                result.normalised.numpy(),
                folder / "patching.png",
                logit_attribution=heads_dla,
                title=title,
                method=result.method,
                direction=direction,
            )
    except OSError as e:
        raise write_failed("--out", out, e) from None

    for note in notes:
        typer.echo(f"headwise: warning: {note}", err=True)
    typer.echo(f"{hm.title}")
    typer.echo(f"metric clean {clean_m:+.3f}, corrupted {corrupt_m:+.3f} ({result.method}, {direction})")
    flat = [
        (float(result.normalised[layer, head]), layer, head)
        for layer in range(result.normalised.shape[0])
        for head in range(result.normalised.shape[1])
        if not math.isnan(float(result.normalised[layer, head]))
    ]
    flat.sort(key=lambda t: -abs(t[0]))
    typer.echo("heads with the largest normalised effect: " + ", ".join(f"L{la}H{h} {v:+.2f}" for v, la, h in flat[:5]))
    typer.echo(f"{result.passes} forward passes, {result.seconds:.1f} s; wrote {', '.join(OUTPUTS)} to {out}")
