"""``headwise patch``'s flow: the decoder opened, the texts and tokens encoded, the sweep run on one process or across
the ranks of a ``torchrun`` launch, the direct logit attribution of both texts, and ``patching.json`` /
``patching.csv`` assembled — everything the command writes but the picture.

:func:`run` takes a :class:`PatchOptions` (checked in one place, errors naming the option) and returns a
:class:`PatchResult`; progress goes to callbacks. The command line writes the files and draws ``patching.png``.

Shape legend: NL layers, H heads, K heads patched per position, L tokens.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from headwise.commands import said
from headwise.models.layer_walk import layer_walk

if TYPE_CHECKING:
    from headwise.models import HeadModel

__all__ = [
    "PATCH_DIRECTIONS", "PATCH_METHODS", "PatchFound", "PatchOptions", "PatchResult", "parse_heads", "patch_csv",
    "patching_json", "patch_study", "patch_target", "run", "top_line",
]  # fmt: skip

#: ``--method``'s choices and ``--direction``'s.
PATCH_METHODS = ("exact", "attribution")
PATCH_DIRECTIONS = ("denoise", "noise")


@dataclass(frozen=True)
class PatchOptions:
    """What ``headwise patch`` reads and writes (its options).

    Attributes:
        model: a decoder :func:`headwise.models.open_model` opens (a folder, a GGUF file, a bundled name).
        clean: the clean text (the answer is right); corrupted: the corrupted text, of the same token length.
        answer: the answer token, as typed (``" Mary"``); wrong: the token it is compared with.
        out: the output folder (written whole later, or not at all).
        method: ``"exact"`` or ``"attribution"`` (:data:`PATCH_METHODS`); direction: ``"denoise"`` or ``"noise"``.
        heads: ``"LAYER.HEAD"`` specs also patched one position at a time (checked against the model).
        batch_size: patched copies per forward pass.
        max_memory: the process's peak memory budget (``"1.5GB"``; None: what the machine has free).
    Raises:
        ValueError: naming the option: an unknown method or direction, an ``out`` that is a file.
    """

    model: str
    clean: str
    corrupted: str
    answer: str
    wrong: str
    out: Path
    method: str = "exact"
    direction: str = "denoise"
    heads: tuple[str, ...] = ()
    batch_size: int = 16
    max_memory: str | None = None

    def __post_init__(self):
        from headwise.commands._folders import check_out

        if self.method not in PATCH_METHODS:
            raise ValueError(f"--method: expected one of {', '.join(PATCH_METHODS)}, got {self.method!r}")
        if self.direction not in PATCH_DIRECTIONS:
            raise ValueError(f"--direction: expected one of {', '.join(PATCH_DIRECTIONS)}, got {self.direction!r}")
        object.__setattr__(self, "out", Path(self.out))
        object.__setattr__(self, "heads", tuple(self.heads))
        check_out(self.out)


@dataclass
class PatchResult:
    """What :func:`run` found (rank 0), for the command line to write and print.

    Attributes:
        options: the options run; hm: the model.
        found: the :class:`PatchFound` (the sweep, the per-position patches, the attribution, the ranks' lines).
        report: ``patching.json``'s content; csv: ``patching.csv``'s text.
    """

    options: PatchOptions
    hm: HeadModel
    found: PatchFound
    report: dict
    csv: str


def run(
    options: PatchOptions,
    *,
    stages: Callable = contextlib.nullcontext,
    layers: Callable = contextlib.nullcontext,
    note: Callable[[str], None] = lambda line: None,
) -> PatchResult | None:
    """``headwise patch``: the decoder of ``--model`` opened (a model opened layer by layer said to ``note``: every
    patched batch streams the layers through), the texts and tokens encoded and checked, then :func:`patch_study`.
    ``stages()``: rank 0's stage bars; ``layers(hm)``: around the run of an opened model. Returns None on ranks other
    than 0.

    Raises:
        ValueError: one line naming the option, before anything is written; CollectiveTimeout: a stalled rank.
    """
    import torch

    from headwise.commands._decoder import encode_text, encode_token, open_decoder
    from headwise.patching import logit_difference

    o = options
    hm = open_decoder(o.model, max_memory=o.max_memory)
    if hm.stream is not None:  # every patched batch streams the layers through; the attribution walks them back
        note(hm.memory.line())
    clean_ids = encode_text(hm, "--clean", o.clean)
    corrupted_ids = encode_text(hm, "--corrupted", o.corrupted)
    if len(clean_ids) != len(corrupted_ids):
        raise ValueError(
            f"--corrupted: {len(corrupted_ids)} tokens, but --clean has {len(clean_ids)}; patching swaps the same "
            "positions, so both texts must have the same token length"
        )
    answer_id = encode_token(hm, "--answer", o.answer)
    wrong_id = encode_token(hm, "--wrong", o.wrong)
    if answer_id == wrong_id:
        raise ValueError(f"--wrong: {o.wrong!r} is the same token as --answer {o.answer!r} (id {answer_id})")
    target = patch_target(hm)
    chosen = parse_heads(target, list(o.heads))
    metric = logit_difference(answer_id, wrong_id)
    c, x = torch.tensor([clean_ids]), torch.tensor([corrupted_ids])
    from headwise.models.layer_walk import check_walk

    if o.method != "exact":
        from headwise.patching.attribution import attribution_activations

        check_walk(hm, "--method attribution", activations=attribution_activations(hm, *c.shape))
    else:  # one patched job a pass at least, beside both cached runs
        from headwise.patching.exact import exact_activations
        from headwise.patching.metric import reads_last_position

        check_walk(hm, "patch", activations=exact_activations(hm, c.shape, reads_last_position(metric)))
    with layer_walk(hm), layers(hm):  # layer by layer: differentiated so; the pass, the layer and the time left
        found = patch_study(hm, target, c, x, metric, chosen, method=o.method, direction=o.direction,
                            batch_size=o.batch_size, out=o.out, stages=stages)  # fmt: skip
    if found is None:  # not rank 0: rank 0 writes
        return None
    texts = {"clean": o.clean, "corrupted": o.corrupted, "answer": o.answer, "wrong": o.wrong}
    ids = {"clean": clean_ids, "corrupted": corrupted_ids, "answer": answer_id, "wrong": wrong_id}
    report = patching_json(hm, found, chosen, direction=o.direction, texts=texts, ids=ids)
    return PatchResult(o, hm, found, report, patch_csv(found.result, found.dla))


def parse_heads(target, specs: list[str]) -> list[tuple[int, int]]:
    """``["23.3", …]`` (``--head``) as checked ``(layer, head)`` pairs.

    Raises:
        ValueError: ``--head: …`` (one line): not LAYER.HEAD, a layer or head out of range.
    """
    from headwise.checks import head_number, layer_number

    heads = []
    for spec in specs:
        parts = spec.split(".")
        if len(parts) != 2 or not all(p.strip().lstrip("-").isdigit() for p in parts):
            raise ValueError(f"--head: expected LAYER.HEAD (e.g. 23.3), got {spec!r}")
        layer, head = int(parts[0]), int(parts[1])
        layer_number("--head", layer, target.num_layers, subject=f"layer {layer} in {spec!r}")
        head_number("--head", head, layer, target.heads_per_layer[layer], subject=f"head {head} in {spec!r}")
        heads.append((layer, head))
    return heads


def _number(x: float) -> float | None:
    return None if x is None or math.isnan(x) else round(float(x), 6)


def _grid(values) -> list[list[float | None]]:
    return [[_number(v) for v in row] for row in values.tolist()]


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


@dataclass
class PatchFound:
    """What :func:`patch_study` found (rank 0).

    Attributes:
        result: the :class:`~headwise.patching.Patching` of the sweep.
        positions: ``(K, L)`` the chosen heads patched one position at a time, or None.
        dla: ``{"clean", "corrupted"}``: each text's direct logit attribution as heads.json writes it (empty when it
            was skipped); notes: what was skipped, one line each (warnings).
        lines: under torchrun, what the ranks did (for the terminal).
    """

    result: object
    positions: object
    dla: dict
    notes: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def patch_target(hm: HeadModel):
    """The model as patching reads it (:func:`headwise.patching.as_target`); ValueError ``--model: …`` when it cannot
    (a Hugging Face model without a language-model head)."""
    from headwise.patching import as_target

    try:
        return as_target(hm)
    except ValueError as e:
        raise ValueError(f"--model: {e}") from None


def patch_study(
    hm: HeadModel,
    target,
    c,
    x,
    metric,
    chosen: list[tuple[int, int]],
    *,
    method: str,
    direction: str,
    batch_size: int,
    out: Path,
    stages: Callable = contextlib.nullcontext,
) -> PatchFound | None:
    """``headwise patch``'s run: the sweep (``method`` exact or attribution) of the clean ids ``c`` ``(1, L)`` and the
    corrupted ``x`` ``(1, L)`` under ``metric``, the ``chosen`` heads per position, and the direct logit attribution of
    both texts. Under torchrun the exact sweep's batches are dealt to the ranks
    (:func:`~headwise.study.patch_across_ranks`, resumable from ``out``'s shards); attribution runs on rank 0 alone.
    ``target``: :func:`patch_target`'s view of ``hm``. ``stages()``: a context manager yielding rank 0's
    ``progress(stage, done, total)``. Returns None on ranks other than 0.

    Raises:
        CollectiveTimeout: a stalled rank.
    """
    from headwise.distributed.ranks import first_rank, launched
    from headwise.patching import attribution_patch, direct_logit_attribution, patch_heads, patch_positions

    across, first = launched(), first_rank()
    if across and method != "exact" and not first:
        return None  # one forward and one backward pass: rank 0 runs it alone
    lines: list[str] = []
    with stages() if first else contextlib.nullcontext() as progress:
        say = progress or (lambda stage, done, total: None)
        if across and method == "exact":
            from headwise.study.patch_ranks import patch_across_ranks

            shown = lambda done, total: say("batches of rank 0", done, total)  # noqa: E731
            run = patch_across_ranks(
                hm, c, x, metric, heads=chosen, direction=direction, batch_size=batch_size, out=out, progress=shown
            )
            if run.patching is None:  # not rank 0: rank 0 writes
                return None
            lines.append(
                f"{run.world_size} ranks; rank 0: {len(run.computed)} batch(es) computed, {len(run.resumed)} resumed "
                f"from {out / 'shards'}; {run.payload_bytes} bytes gathered"
            )
            result, positions = run.patching, None if run.positions is None else run.positions[0]
        else:
            if method == "exact":
                result = patch_heads(target, c, x, metric, direction=direction, batch_size=batch_size,
                                     progress=lambda done, total: say("patched alone", done, total))  # fmt: skip
            else:
                say("attribution patching", 0, 1)
                result = attribution_patch(target, c, x, metric, direction=direction)
                say("attribution patching", 1, 1)
            positions = None
            if chosen:
                positions = patch_positions(
                    target, c, x, metric, chosen, direction=direction, batch_size=batch_size,
                    progress=lambda done, total: say("patched per position", done, total),
                )[0]  # (K, L)  # fmt: skip
        dla: dict = {}
        notes = []
        try:
            for name, ids in (("clean", c), ("corrupted", x)):
                dla[name] = _dla_json(direct_logit_attribution(target, ids, metric))
        except ValueError as e:
            dla = {}
            notes.append(f"direct logit attribution skipped: {said(e)}")
    return PatchFound(result, positions, dla, notes, lines)


def patching_json(hm: HeadModel, found: PatchFound, chosen, *, direction: str, texts: dict, ids: dict) -> dict:
    """``patching.json``: the model, the texts (``texts``: ``{"clean", "corrupted", "answer", "wrong"}`` as typed;
    ``ids``: the clean and corrupted ids and the answer's and wrong token's id), both metrics, the patched metric and
    its normalised effect per layer and head, the per-position patches and the direct logit attribution."""
    result, positions = found.result, found.positions
    clean_m, corrupt_m = float(result.metric_clean.mean()), float(result.metric_corrupted.mean())
    report = {
        "model": hm.name,
        "family": hm.family,
        "method": result.method,
        "direction": direction,
        "metric": "logit(answer) - logit(wrong) at the last position",
        "clean": texts["clean"],
        "corrupted": texts["corrupted"],
        "clean_ids": ids["clean"],
        "corrupted_ids": ids["corrupted"],
        "clean_tokens": hm.token_texts(ids["clean"]),
        "corrupted_tokens": hm.token_texts(ids["corrupted"]),
        "clean_pieces": hm.token_strings(ids["clean"]),
        "corrupted_pieces": hm.token_strings(ids["corrupted"]),
        "answer": {"text": texts["answer"], "id": ids["answer"]},
        "wrong": {"text": texts["wrong"], "id": ids["wrong"]},
        "metric_clean": _number(clean_m),
        "metric_corrupted": _number(corrupt_m),
        "patched": _grid(result.mean_patched),
        "normalised": _grid(result.normalised),
        "passes": result.passes,
        "seconds": round(result.seconds, 3),
        "forward_seconds": round(result.forward_seconds, 4),
        "logit_attribution": found.dla or None,
    }
    if result.per_position is not None:
        report["attribution_per_position"] = [_grid(layer) for layer in result.per_position[0]]
    if positions is not None:
        report["positions"] = {
            "heads": [list(h) for h in chosen],
            "patched": _grid(positions),
            "normalised": _grid((positions - corrupt_m) / (clean_m - corrupt_m)) if clean_m != corrupt_m else None,
        }
    if found.notes:
        report["notes"] = found.notes
    return report


def patch_csv(result, dla: dict) -> str:
    """``patching.csv``: one row per head (patched, normalised, each text's direct logit attribution), then the
    attention biases, MLPs and the rest of the attribution."""
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


def top_line(result, n: int = 5) -> str:
    """The ``n`` heads with the largest normalised effect, one line."""
    flat = [
        (float(result.normalised[layer, head]), layer, head)
        for layer in range(result.normalised.shape[0])
        for head in range(result.normalised.shape[1])
        if not math.isnan(float(result.normalised[layer, head]))
    ]
    flat.sort(key=lambda t: -abs(t[0]))
    return "heads with the largest normalised effect: " + ", ".join(f"L{la}H{h} {v:+.2f}" for v, la, h in flat[:n])
