"""``headwise circuit``: the circuit of heads that carries an answer — edges scored, checked, kept while faithful.

``headwise circuit --model M --clean TEXT --corrupted TEXT --answer A --wrong W --out DIR
[--pairs FILE] [--method eap|eap-ig|atp*|exact] [--steps N] [--metric logit_diff|prob|kl]
[--ablation corrupted|mean] [--fraction F] [--exact-top N] [--batch-size N] [--max-edges N] [--mib DIR]
[--evaluate FILE] [--max-memory SIZE]``

:func:`headwise.circuits.find_circuit` scores every edge of the model's graph — from the embeddings, each query
head and each MLP into each head's query, each key/value group's keys and values, each MLP and the logits — by
EAP, EAP-IG or the exact patch of each edge, patches the strongest estimates exactly beside them, draws the
faithfulness curve (the top n edges kept, every other ablated) and keeps the smallest circuit that recovers
``--fraction`` of the metric.

Prompt pairs: ``--clean``, ``--corrupted``, ``--answer`` and ``--wrong`` repeated once per pair, in order (an
``--answer`` or ``--wrong`` given once serves every pair), or ``--pairs FILE``: JSON Lines, one object per line
with the keys ``clean``, ``corrupted``, ``answer`` and ``wrong`` (blank lines skipped) — JSON keeps the leading
space of a byte-level BPE answer such as ``" Mary"`` where a tab-separated file would hide it.

Writes into ``--out`` (the folder appears whole or not at all): ``circuit.json``
(:meth:`headwise.circuits.Circuit.to_dict`: the nodes, every edge with each method's score, the agreement of
estimate and exact patch, the faithfulness curve, the circuit chosen, each node's pattern and direct effect),
``circuit.png`` (:func:`headwise.viz.circuit.plot_circuit`) and ``circuit.html``
(:func:`headwise.viz.circuit_page.write_circuit_page`, offline: click a node for its pattern and direct effect).

``--mib DIR`` also writes the run's files in MIB's circuit format (:mod:`headwise.circuits.mib`): ``importances.json``
(every edge's score) and ``circuit_<f>.json`` for each of MIB's fractions f. circuit.json's ``"mib"`` holds MIB's curve
(the top ``int(f·E)`` edges, pruned as MIB prunes them), CPR and CMD. ``--evaluate FILE`` scores a MIB-format
importance file from any tool instead of finding a circuit: no attribution, the curve at MIB's fractions with CPR and
CMD printed and written to ``--out/mib.json``.

A model larger than ``--max-memory`` (default: 80% of the memory free) is opened layer by layer and differentiated
layer by layer (:func:`headwise.models.layer_walk.layer_walk`): each gradient pass keeps the residual stream at the
layer boundaries and walks the layers in reverse, bringing each layer's weights in again; the scores equal the whole
route's. The run is weighed first (one layer's weights and the activations it keeps,
:func:`headwise.circuits.footprint.circuit_activations`): a budget below it is one line naming the memory needed.

Under ``torchrun --nproc-per-node P -m headwise circuit …`` the prompt pairs are split across the ranks
(:func:`headwise.study.circuit_across_ranks`): every per-pair value is gathered before a mean, so every rank picks
the same top edges and rank 0 writes the one-process files (to float32 rounding). More ranks than pairs is refused.
Until the files are written, ``--out/stages`` keeps each stage's gathered result (the edges' scores, the exact
patches, the faithfulness curve, the circuit), so a run restarted (``torchrun --max-restarts``) or started again with
the same options loads the finished stages; a manifest of another run is refused. The finished folder holds the
three files alone. See ``docs/distributed.md``.

Bad input — an unknown method, metric or ablation, a fraction outside (0, 1], pairs given both ways or not at
all, counts that do not match, texts of different token lengths, an answer or wrong token of several tokens,
identical answer and wrong tokens, a malformed pairs file, an ``--evaluate`` file that is not JSON, of another
model's shape, with unknown or missing edges or scores that are not finite numbers — is one line on stderr and exit
status 2, before anything is written.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from headwise import study
from headwise.cli._app import CLIError, app
from headwise.cli._output import write_failed
from headwise.cli._progress import layer_progress, stage_progress

OUTPUTS = ("circuit.json", "circuit.png", "circuit.html")


@app.command()
def circuit(
    model: Annotated[
        str,
        typer.Option("--model", help="A decoder: a model folder, a GGUF file, or 'smollm2' (as headwise patch)."),
    ],
    out: Annotated[Path, typer.Option("--out", help="Folder for circuit.json / .png / .html.")],
    clean: Annotated[
        list[str] | None, typer.Option("--clean", help="A clean text (the answer is right); repeat per pair.")
    ] = None,
    corrupted: Annotated[
        list[str] | None, typer.Option("--corrupted", help="Its corrupted text, of the same token length.")
    ] = None,
    answer: Annotated[
        list[str] | None, typer.Option("--answer", help="The answer token, as typed (e.g. ' Mary'); once or per pair.")
    ] = None,
    wrong: Annotated[
        list[str] | None, typer.Option("--wrong", help="The wrong token it is compared with; once or per pair.")
    ] = None,
    pairs: Annotated[
        Path | None,
        typer.Option("--pairs", help="JSON Lines of {clean, corrupted, answer, wrong} (instead of the four options)."),
    ] = None,
    method: Annotated[
        str, typer.Option("--method", help="eap, eap-ig, atp* (patterns recomputed exactly) or exact (every edge).")
    ] = "eap",
    steps: Annotated[int, typer.Option("--steps", min=1, help="EAP-IG's integrated-gradient steps.")] = 5,
    metric: Annotated[
        str, typer.Option("--metric", help="logit_diff, prob (the answer's) or kl (to the clean run; eap-ig, exact).")
    ] = "logit_diff",
    ablation: Annotated[
        str, typer.Option("--ablation", help="What the edges left out carry: corrupted (its run) or mean.")
    ] = "corrupted",
    fraction: Annotated[
        float, typer.Option("--fraction", help="The share of the metric the circuit must recover, in (0, 1].")
    ] = 0.8,
    exact_top: Annotated[
        int, typer.Option("--exact-top", min=0, help="The strongest estimates also patched exactly (0: none).")
    ] = 20,
    batch_size: Annotated[
        int | None, typer.Option("--batch-size", min=1, help="Patched copies per forward pass.")
    ] = None,
    max_edges: Annotated[
        int, typer.Option("--max-edges", min=0, help="circuit.png: most edges drawn of the circuit and of the rest.")
    ] = 200,
    qk_heads: Annotated[
        int,
        typer.Option(
            "--qk-heads", min=0, help="circuit.html: the circuit's strongest heads shown with their QK attribution."
        ),
    ] = 20,
    mib: Annotated[
        Path | None, typer.Option("--mib", help="Also write the run in MIB's format: importances and circuits.")
    ] = None,
    evaluate: Annotated[
        Path | None,
        typer.Option("--evaluate", help="Score this MIB-format importance file at MIB's fractions (no attribution)."),
    ] = None,
    max_memory: Annotated[
        str | None, typer.Option("--max-memory", help="Peak memory budget: 4GB, 400MB (default 80% free).")
    ] = None,
    bootstrap: Annotated[
        int,
        typer.Option(
            "--bootstrap",
            min=0,
            help="Resample the prompt pairs N times (≥ 2): each edge's interval, the circuit's Jaccard (0: none).",
        ),
    ] = 0,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed of the bootstrap's resamples.")] = 0,
) -> None:
    """Find the circuit of heads that carries an answer: every edge scored, the strongest checked exactly, the
    smallest faithful circuit kept; circuit.json, circuit.png and an offline circuit.html."""
    from headwise.commands import circuit as flow

    options = flow.CircuitOptions(
        model=model, out=out, clean=tuple(clean or ()), corrupted=tuple(corrupted or ()), answer=tuple(answer or ()),
        wrong=tuple(wrong or ()), pairs=pairs, method=method, steps=steps, metric=metric, ablation=ablation,
        fraction=fraction, exact_top=exact_top, batch_size=batch_size, qk_heads=qk_heads, mib=mib, evaluate=evaluate,
        max_memory=max_memory, bootstrap=bootstrap, seed=seed,
    )  # fmt: skip
    try:
        got = flow.run(options, stages=partial(stage_progress, "circuit"), warn=lambda m: typer.echo(m, err=True),
                       note=typer.echo, layers=partial(layer_progress, command="circuit"))  # fmt: skip
    except study.CollectiveTimeout as e:
        raise CLIError(str(e)) from None
    if got is None:  # not rank 0: rank 0 writes
        return
    if evaluate is not None:
        return _evaluate(got)
    hm, found, report, prompts = got.hm, got.found, got.report, got.prompts
    for line in found.lines:
        typer.echo(line)
    title = f"{hm.title}: {len(prompts)} prompt pair{'s' if len(prompts) > 1 else ''}, {method}, {metric}"
    _write(out, report, max_edges=max_edges, title=title, page_title=hm.title)
    written = list(OUTPUTS)
    if mib is not None:
        try:
            written += [f"{mib}/{name}" for name in flow.write_mib(hm, found.circuit, mib)]
        except OSError as e:
            raise write_failed("--mib", mib, e) from None

    typer.echo(hm.title)
    for line in flow.circuit_lines(
        found.circuit, report, method=method, metric=metric, ablation=ablation, exact_top=exact_top
    ):
        typer.echo(line)
    typer.echo(f"{found.circuit.seconds:.1f} s; wrote {', '.join(OUTPUTS)} to {out}")
    if mib is not None:
        typer.echo(f"wrote MIB's importances and {len(written) - len(OUTPUTS) - 1} circuits to {mib}")


def _write(out: Path, report: dict, *, max_edges: int, title: str, page_title: str) -> None:
    """``--out``, whole or not at all: circuit.json, circuit.png (``title`` over it) and circuit.html."""
    from headwise._io import atomic_folder, write_text_atomic
    from headwise.viz.circuit import plot_circuit
    from headwise.viz.circuit_page import write_circuit_page

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_folder(out) as folder:
            write_text_atomic(folder / "circuit.json", json.dumps(report, indent=1, ensure_ascii=False) + "\n")
            plot_circuit(report, folder / "circuit.png", max_edges=max_edges, title=title)
            write_circuit_page(report, folder / "circuit.html", title=page_title)
    except OSError as e:
        raise write_failed("--out", out, e) from None


def _evaluate(got) -> None:
    """``--evaluate``: the MIB-format file's scores (:func:`headwise.commands.circuit.mib_evaluation`) printed and
    written to ``--out/mib.json``."""
    import time

    from headwise._io import atomic_folder, write_text_atomic
    from headwise.commands.circuit import mib_lines

    report, out, path = got.report, got.options.out, got.options.evaluate
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_folder(out) as folder:
            write_text_atomic(folder / "mib.json", json.dumps(report, indent=1) + "\n")
    except OSError as e:
        raise write_failed("--out", out, e) from None
    typer.echo(got.hm.title)
    typer.echo(
        f"{path}: {report['num_edges']} edges; metric ({report['metric']}) clean {report['clean_metric']:+.3f}, "
        f"nothing kept {report['ablated_metric']:+.3f} ({report['ablation']} ablation)"
    )
    for line in mib_lines(report["mib"]):
        typer.echo(line)
    typer.echo(f"{time.perf_counter() - got.started:.1f} s; wrote mib.json to {out}")
