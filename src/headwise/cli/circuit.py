"""``headwise circuit``: the circuit of heads that carries an answer — edges scored, checked, kept while faithful.

``headwise circuit --model M --clean TEXT --corrupted TEXT --answer A --wrong W --out DIR
[--pairs FILE] [--method eap|eap-ig|atp*|exact] [--steps N] [--metric logit_diff|prob|kl]
[--ablation corrupted|mean] [--fraction F] [--exact-top N] [--batch-size N] [--max-edges N] [--mib DIR]
[--evaluate FILE]``

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
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from headwise import study
from headwise.cli._app import CLIError, app
from headwise.cli._decoder import encode_text, encode_token, open_decoder
from headwise.cli._output import write_failed
from headwise.cli._progress import stage_progress

if TYPE_CHECKING:
    from headwise.models import HeadModel

METHODS = ("eap", "eap-ig", "atp*", "exact")
METRICS = ("logit_diff", "prob", "kl")
ABLATIONS = ("corrupted", "mean")
OUTPUTS = ("circuit.json", "circuit.png", "circuit.html")
FIELDS = ("clean", "corrupted", "answer", "wrong")


def read_pairs(path: Path) -> list[dict]:
    """The prompt pairs of a JSON Lines file: ``[{"clean", "corrupted", "answer", "wrong"}, …]``.

    Raises:
        CLIError: a missing or unreadable file, a line that is not a JSON object of those four strings, no pair.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CLIError(f"--pairs: cannot read '{path}': {getattr(e, 'strerror', None) or e}") from None
    pairs = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise CLIError(
                f"--pairs: line {number} of '{path}' is not JSON ({e.msg}); expected one object a line"
            ) from None
        if (
            not isinstance(row, dict)
            or sorted(row) != sorted(FIELDS)
            or not all(isinstance(row[k], str) for k in FIELDS)
        ):
            got = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise CLIError(
                f"--pairs: line {number} of '{path}' must be an object of the strings {', '.join(FIELDS)}; got {got}"
            )
        pairs.append({k: row[k] for k in FIELDS})
    if not pairs:
        raise CLIError(f"--pairs: '{path}' holds no prompt pair")
    return pairs


def options_pairs(clean: list[str], corrupted: list[str], answer: list[str], wrong: list[str]) -> list[dict]:
    """The prompt pairs of repeated ``--clean``/``--corrupted``/``--answer``/``--wrong`` (answer and wrong once
    for every pair, or once per pair)."""
    if not clean or not corrupted or not answer or not wrong:
        missing = [f"--{k}" for k, v in zip(FIELDS, (clean, corrupted, answer, wrong)) if not v]
        raise CLIError(
            f"{', '.join(missing)}: missing; give every one of --clean, --corrupted, --answer, --wrong, or --pairs FILE"
        )
    if len(corrupted) != len(clean):
        raise CLIError(f"--corrupted: given {len(corrupted)} times for {len(clean)} --clean; expected one per pair")
    for option, values in (("--answer", answer), ("--wrong", wrong)):
        if len(values) not in (1, len(clean)):
            raise CLIError(
                f"{option}: given {len(values)} times for {len(clean)} pairs; expected once, or once per pair"
            )
    answer = answer * len(clean) if len(answer) == 1 else answer
    wrong = wrong * len(clean) if len(wrong) == 1 else wrong
    return [dict(zip(FIELDS, row)) for row in zip(clean, corrupted, answer, wrong)]


def encode_pairs(hm: HeadModel, pairs: list[dict], source: str) -> dict[str, list]:
    """The pairs as the model reads them: ``{"clean", "corrupted": P lists of L ids, "answer", "wrong": P ids}``.

    Every text encodes within the model, every pair has one token length (the same for all pairs), every
    answer and wrong token is one token and they differ — else a ``CLIError`` naming the pair."""
    length = None
    encoded: dict[str, list] = {f: [] for f in FIELDS}
    for k, pair in enumerate(pairs):
        where = f" (pair {k + 1} of {source})" if len(pairs) > 1 or source != "the options" else ""
        ids = {f: encode_text(hm, f"--{f}{where}", pair[f]) for f in ("clean", "corrupted")}
        if len(ids["clean"]) != len(ids["corrupted"]):
            raise CLIError(
                f"--corrupted{where}: {len(ids['corrupted'])} tokens, but --clean has {len(ids['clean'])}; "
                "patching swaps the same positions, so both texts must have the same token length"
            )
        if length is not None and len(ids["clean"]) != length:
            raise CLIError(
                f"--clean{where}: {len(ids['clean'])} tokens, but the first pair has {length}; the pairs run as one "
                "batch, so every text must have the same token length"
            )
        length = len(ids["clean"])
        a = encode_token(hm, f"--answer{where}", pair["answer"])
        w = encode_token(hm, f"--wrong{where}", pair["wrong"])
        if a == w:
            raise CLIError(
                f"--wrong{where}: {pair['wrong']!r} is the same token as --answer {pair['answer']!r} (id {a})"
            )
        for f, value in (("clean", ids["clean"]), ("corrupted", ids["corrupted"]), ("answer", a), ("wrong", w)):
            encoded[f].append(value)
    return encoded


def _choice(option: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise CLIError(f"{option}: expected one of {', '.join(choices)}, got {value!r}")


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
) -> None:
    """Find the circuit of heads that carries an answer: every edge scored, the strongest checked exactly, the
    smallest faithful circuit kept; circuit.json, circuit.png and an offline circuit.html."""
    import torch

    from headwise._io import atomic_folder, write_text_atomic
    from headwise.viz.circuit import plot_circuit
    from headwise.viz.circuit_page import write_circuit_page

    _choice("--method", method, METHODS)
    _choice("--metric", metric, METRICS)
    _choice("--ablation", ablation, ABLATIONS)
    if not 0 < fraction <= 1:
        raise CLIError(f"--fraction: expected a number in (0, 1], got {fraction!r}")
    if metric == "kl" and method in ("eap", "atp*"):
        raise CLIError(
            f"--metric: 'kl' has no gradient on the clean run, so {method} scores every edge 0; use --method eap-ig"
        )
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out: '{out}' exists and is not a folder")
    if mib is not None and (evaluate is not None or (mib.exists() and not mib.is_dir())):
        raise CLIError(f"--mib: '{mib}' " + ("given with --evaluate" if evaluate else "exists and is not a folder"))
    given = [f"--{k}" for k, v in zip(FIELDS, (clean, corrupted, answer, wrong)) if v]
    if pairs is not None:
        if given:
            raise CLIError(f"--pairs: given with {', '.join(given)}; give the pairs one way, the file or the options")
        prompts, source = read_pairs(pairs), f"'{pairs}'"
    else:
        prompts, source = options_pairs(clean or [], corrupted or [], answer or [], wrong or []), "the options"
    hm = open_decoder(model, reads="a circuit is traced to a decoder's next-token logits",
                      whole="circuit (a backward pass through every layer)")  # fmt: skip
    ids = encode_pairs(hm, prompts, source)
    if mib is not None:
        study.check_mib(hm, method)
    if evaluate is not None:
        return _evaluate(hm, ids, evaluate, out, metric=metric, ablation=ablation, batch_size=batch_size or 8)

    options = dict(
        method=method, steps=steps, metric=metric, ablation=ablation, fraction=fraction, exact_top=exact_top,
        batch_size=batch_size, shares=mib is not None and method != "exact",
    )  # fmt: skip
    args = (torch.tensor(ids["clean"]), torch.tensor(ids["corrupted"]))  # (P, L), encoded and checked above
    try:
        run = study.circuit_study(hm, *args, answer=ids["answer"], wrong=ids["wrong"], out=out, stages=stage_progress,
                                  **options)  # fmt: skip
    except study.CollectiveTimeout as e:
        raise CLIError(str(e)) from None
    if run is None:  # not rank 0: rank 0 writes
        return
    for line in run.lines:
        typer.echo(line)
    found = run.circuit
    report = found.to_dict()
    report["prompts"] = prompts  # the texts as typed (the library, handed ids, lists the ids)
    with stage_progress() as progress:
        study.add_qk(hm, report, ids["clean"][0], qk_heads, warn=lambda m: typer.echo(m, err=True), progress=progress)
    title = f"{hm.title}: {len(prompts)} prompt pair{'s' if len(prompts) > 1 else ''}, {method}, {metric}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_folder(out) as folder:
            write_text_atomic(folder / "circuit.json", json.dumps(report, indent=1, ensure_ascii=False) + "\n")
            plot_circuit(report, folder / "circuit.png", max_edges=max_edges, title=title)
            write_circuit_page(report, folder / "circuit.html", title=hm.title)
    except OSError as e:
        raise write_failed("--out", out, e) from None
    written = list(OUTPUTS)
    if mib is not None:
        try:
            written += [f"{mib}/{name}" for name in study.write_mib(hm, found, mib)]
        except OSError as e:
            raise write_failed("--mib", mib, e) from None

    typer.echo(hm.title)
    for line in study.circuit_lines(
        found, report, method=method, metric=metric, ablation=ablation, exact_top=exact_top
    ):
        typer.echo(line)
    typer.echo(f"{found.seconds:.1f} s; wrote {', '.join(OUTPUTS)} to {out}")
    if mib is not None:
        typer.echo(f"wrote MIB's importances and {len(written) - len(OUTPUTS) - 1} circuits to {mib}")


def _evaluate(hm: HeadModel, ids: dict, path: Path, out: Path, **options) -> None:
    """``--evaluate``: the MIB-format file scored on the pairs, printed and written to ``--out/mib.json``."""
    import time

    import torch

    from headwise._io import atomic_folder, write_text_atomic

    t0 = time.perf_counter()
    with stage_progress() as progress:
        report = study.mib_evaluation(
            hm, torch.tensor(ids["clean"]), torch.tensor(ids["corrupted"]), answer=ids["answer"], wrong=ids["wrong"],
            path=path, option="--evaluate", progress=lambda done, total: progress("MIB's curve", done, total),
            **options,
        )  # fmt: skip
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_folder(out) as folder:
            write_text_atomic(folder / "mib.json", json.dumps(report, indent=1) + "\n")
    except OSError as e:
        raise write_failed("--out", out, e) from None
    typer.echo(hm.title)
    typer.echo(
        f"{path}: {report['num_edges']} edges; metric ({report['metric']}) clean {report['clean_metric']:+.3f}, "
        f"nothing kept {report['ablated_metric']:+.3f} ({report['ablation']} ablation)"
    )
    for line in study.mib_lines(report["mib"]):
        typer.echo(line)
    typer.echo(f"{time.perf_counter() - t0:.1f} s; wrote mib.json to {out}")
