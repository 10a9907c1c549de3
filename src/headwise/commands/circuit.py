"""``headwise circuit``'s flow: the prompt pairs read and encoded, the circuit found on one process or across the ranks
of a ``torchrun`` launch, ``circuit.json``'s report with the prompts as typed, and the QK attribution of the circuit's
strongest heads that ``circuit.html`` shows on a click — everything the command writes but the pictures; or, with
``--evaluate``, a MIB-format file scored.

:func:`run` takes a :class:`CircuitOptions` (checked in one place, errors naming the option) and returns a
:class:`CircuitResult`; progress and warnings go to callbacks. The command line writes the files and draws.

Shape legend: P prompt pairs, L tokens.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from headwise.commands import said
from headwise.commands._decoder import encode_text, encode_token
from headwise.models.layer_walk import layer_walk

if TYPE_CHECKING:
    from headwise.models import HeadModel

__all__ = [
    "ABLATIONS",
    "CIRCUIT_STEPS",
    "FIELDS",
    "METHODS",
    "METRICS",
    "STABLE_JACCARD",
    "CircuitFound",
    "CircuitOptions",
    "CircuitResult",
    "encode_pairs",
    "options_pairs",
    "read_pairs",
    "run",
    "add_qk",
    "bootstrap_line",
    "circuit_heads",
    "circuit_lines",
    "circuit_study",
    "check_mib",
    "mib_evaluation",
    "mib_lines",
    "write_mib",
]

METHODS = ("eap", "eap-ig", "atp*", "exact")
METRICS = ("logit_diff", "prob", "kl")
ABLATIONS = ("corrupted", "mean")
FIELDS = ("clean", "corrupted", "answer", "wrong")

#: The circuit's Jaccard across resamples at or above which it is called stable (the bar proposed in print).
STABLE_JACCARD = 0.8

#: What each stage of :func:`headwise.circuits.find_circuit` is called on a progress bar.
CIRCUIT_STEPS = {
    "attribution": "edges scored",
    "exact": "top edges patched exactly",
    "faithfulness": "faithfulness curve",
    "circuit": "smallest circuit",
    "mib": "MIB's curve",
}


def _choice(option: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{option}: expected one of {', '.join(choices)}, got {value!r}")


@dataclass(frozen=True)
class CircuitOptions:
    """What ``headwise circuit`` reads and writes (its options).

    Attributes:
        model: a decoder :func:`headwise.models.open_model` opens; out: the output folder.
        clean, corrupted, answer, wrong: the prompt pairs as repeated options (:func:`options_pairs`), or none of them
            and ``pairs``: a JSON Lines file of them (:func:`read_pairs`).
        method, steps, metric, ablation, fraction, exact_top, batch_size: :func:`headwise.circuits.find_circuit`'s.
        qk_heads: the circuit's strongest heads given their QK attribution (circuit.html).
        mib: also write the run in MIB's format into this folder; evaluate: score this MIB-format importance file
            instead of finding a circuit.
        bootstrap: resamples of the prompt pairs (0: none, else at least 2; not with ``evaluate``); seed: theirs —
            :func:`headwise.circuits.find_circuit`'s.
        max_memory: the process's peak memory budget (``"4GB"``; None: what the machine has free) — a model that
            does not fit whole is opened layer by layer and differentiated layer by layer
            (:func:`headwise.models.layer_walk.layer_walk`).
    Raises:
        ValueError: naming the option: an unknown method, metric or ablation, a fraction outside (0, 1], ``kl`` with a
            method that has no gradient for it, an ``out`` or ``mib`` that is a file, pairs given both ways.
    """

    model: str
    out: Path
    clean: tuple[str, ...] = ()
    corrupted: tuple[str, ...] = ()
    answer: tuple[str, ...] = ()
    wrong: tuple[str, ...] = ()
    pairs: Path | None = None
    method: str = "eap"
    steps: int = 5
    metric: str = "logit_diff"
    ablation: str = "corrupted"
    fraction: float = 0.8
    exact_top: int = 20
    batch_size: int | None = None
    qk_heads: int = 20
    mib: Path | None = None
    evaluate: Path | None = None
    max_memory: str | None = None
    bootstrap: int = 0
    seed: int = 0

    def __post_init__(self):
        from headwise.commands._folders import check_out

        for name in FIELDS:
            object.__setattr__(self, name, tuple(getattr(self, name)))
        _choice("--method", self.method, METHODS)
        _choice("--metric", self.metric, METRICS)
        _choice("--ablation", self.ablation, ABLATIONS)
        if not 0 < self.fraction <= 1:
            raise ValueError(f"--fraction: expected a number in (0, 1], got {self.fraction!r}")
        if self.metric == "kl" and self.method in ("eap", "atp*"):
            raise ValueError(
                f"--metric: 'kl' has no gradient on the clean run, so {self.method} scores every edge 0; use --method "
                "eap-ig"
            )
        check_out(Path(self.out))
        b = self.bootstrap
        if isinstance(b, bool) or not isinstance(b, int) or b < 0 or b == 1:
            raise ValueError(f"--bootstrap: expected 0 (none) or at least 2 resamples, got {b!r}")
        if self.bootstrap and self.evaluate is not None:
            raise ValueError("--bootstrap: given with --evaluate, which scores a file and finds no circuit")
        mib, evaluate = self.mib, self.evaluate
        if mib is not None and (evaluate is not None or (mib.exists() and not mib.is_dir())):
            said = "given with --evaluate" if evaluate else "exists and is not a folder"
            raise ValueError(f"--mib: '{mib}' {said}")
        given = [f"--{k}" for k in FIELDS if getattr(self, k)]
        if self.pairs is not None and given:
            raise ValueError(f"--pairs: given with {', '.join(given)}; give the pairs one way, the file or the options")

    def prompts(self) -> tuple[list[dict], str]:
        """The prompt pairs (:func:`read_pairs` or :func:`options_pairs`) and where they came from, for messages."""
        if self.pairs is not None:
            return read_pairs(self.pairs), f"'{self.pairs}'"
        return options_pairs(*(list(getattr(self, k)) for k in FIELDS)), "the options"


@dataclass
class CircuitResult:
    """What :func:`run` found (rank 0), for the command line to write and print.

    Attributes:
        options: the options run; hm: the model; prompts: the pairs as typed.
        found: the :class:`CircuitFound` (None with ``--evaluate``); report: ``circuit.json``'s content (the QK
            attribution of its strongest heads added), or with ``--evaluate`` ``mib.json``'s.
        started: ``time.perf_counter()`` when the evaluation began (``--evaluate``: its seconds count the writing).
    """

    options: CircuitOptions
    hm: HeadModel
    prompts: list[dict]
    found: CircuitFound | None
    report: dict
    started: float = 0.0


def run(
    options: CircuitOptions,
    *,
    stages: Callable = contextlib.nullcontext,
    warn: Callable[[str], None] = lambda message: None,
    note: Callable[[str], None] = lambda line: None,
    layers: Callable = lambda hm: contextlib.nullcontext(),
) -> CircuitResult | None:
    """``headwise circuit``: the pairs read, the decoder opened and the pairs encoded, then :func:`circuit_study` and
    :func:`add_qk` — or, with ``evaluate``, :func:`mib_evaluation` — within a :func:`~headwise.models.layer_walk.
    layer_walk` (a model opened layer by layer, said to ``note``, weighed first: its need over the budget is refused
    in one line). ``stages()``: a context manager yielding rank 0's ``progress(stage, done, total)``; ``layers(hm)``:
    around the run of an opened model (the pass, the layer and the time left). Returns None on ranks other than 0.

    Raises:
        ValueError: one line naming the option, before anything is written; CollectiveTimeout: a stalled rank.
    """
    import torch

    from headwise.commands._decoder import open_decoder

    o = options
    prompts, source = o.prompts()
    hm = open_decoder(o.model, reads="a circuit is traced to a decoder's next-token logits",
                      max_memory=o.max_memory)  # fmt: skip
    ids = encode_pairs(hm, prompts, source)
    clean, corrupted = torch.tensor(ids["clean"]), torch.tensor(ids["corrupted"])  # (P, L), encoded and checked
    if hm.stream is not None:
        note(hm.memory.line())
    with layer_walk(hm), layers(hm):  # a model opened layer by layer: differentiated layer by layer
        return _run(o, hm, prompts, ids, clean, corrupted, stages=stages, warn=warn, note=note)


def _run(o: CircuitOptions, hm, prompts, ids, clean, corrupted, *, stages, warn, note) -> CircuitResult | None:
    """:func:`run` on the opened model and encoded pairs."""
    from headwise.circuits.footprint import circuit_activations, fitted_batch
    from headwise.models.layer_walk import check_walk, walk_need

    if o.mib is not None:
        check_mib(hm, o.method)
    method = "exact" if o.evaluate is not None else o.method
    batch_size = o.batch_size
    if hm.stream is not None and batch_size is None:  # the most jobs a pass whose activations fit the budget
        batch_size = fitted_batch(hm, *clean.shape, method=method, budget=hm.memory.budget,
                                  need=lambda keeps: walk_need(hm, activations=keeps)) or 1  # fmt: skip
        note(f"memory: {batch_size} job{'s' if batch_size > 1 else ''} a patched pass (what the budget holds)")
    keeps = circuit_activations(hm, *clean.shape, method=method, batch_size=batch_size)
    check_walk(hm, "circuit", activations=keeps)
    if o.evaluate is not None:
        started = time.perf_counter()
        with stages() as progress:
            report = mib_evaluation(
                hm, clean, corrupted, answer=ids["answer"], wrong=ids["wrong"], path=o.evaluate, option="--evaluate",
                progress=lambda done, total: progress("MIB's curve", done, total), metric=o.metric,
                ablation=o.ablation, batch_size=batch_size or 8,
            )  # fmt: skip
        return CircuitResult(o, hm, prompts, None, report, started)
    found = circuit_study(
        hm, clean, corrupted, answer=ids["answer"], wrong=ids["wrong"], out=o.out, stages=stages, method=o.method,
        steps=o.steps, metric=o.metric, ablation=o.ablation, fraction=o.fraction, exact_top=o.exact_top,
        batch_size=batch_size, shares=o.mib is not None and o.method != "exact", bootstrap=o.bootstrap, seed=o.seed,
    )  # fmt: skip
    if found is None:  # not rank 0: rank 0 writes
        return None
    report = found.circuit.to_dict()
    report["prompts"] = prompts  # the texts as typed (the library, handed ids, lists the ids)
    with stages() as progress:
        add_qk(hm, report, ids["clean"][0], o.qk_heads, warn=warn, progress=progress)
    return CircuitResult(o, hm, prompts, found, report)


def read_pairs(path: Path) -> list[dict]:
    """The prompt pairs of a JSON Lines file: ``[{"clean", "corrupted", "answer", "wrong"}, …]``.

    Raises:
        ValueError: a missing or unreadable file, a line that is not a JSON object of those four strings, no pair.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--pairs: cannot read '{path}': {getattr(e, 'strerror', None) or e}") from None
    pairs = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"--pairs: line {number} of '{path}' is not JSON ({e.msg}); expected one object a line"
            ) from None
        if (
            not isinstance(row, dict)
            or sorted(row) != sorted(FIELDS)
            or not all(isinstance(row[k], str) for k in FIELDS)
        ):
            got = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise ValueError(
                f"--pairs: line {number} of '{path}' must be an object of the strings {', '.join(FIELDS)}; got {got}"
            )
        pairs.append({k: row[k] for k in FIELDS})
    if not pairs:
        raise ValueError(f"--pairs: '{path}' holds no prompt pair")
    return pairs


def options_pairs(clean: list[str], corrupted: list[str], answer: list[str], wrong: list[str]) -> list[dict]:
    """The prompt pairs of repeated ``--clean``/``--corrupted``/``--answer``/``--wrong`` (answer and wrong once
    for every pair, or once per pair)."""
    if not clean or not corrupted or not answer or not wrong:
        missing = [f"--{k}" for k, v in zip(FIELDS, (clean, corrupted, answer, wrong)) if not v]
        raise ValueError(
            f"{', '.join(missing)}: missing; give every one of --clean, --corrupted, --answer, --wrong, or --pairs FILE"
        )
    if len(corrupted) != len(clean):
        raise ValueError(f"--corrupted: given {len(corrupted)} times for {len(clean)} --clean; expected one per pair")
    for option, values in (("--answer", answer), ("--wrong", wrong)):
        if len(values) not in (1, len(clean)):
            raise ValueError(
                f"{option}: given {len(values)} times for {len(clean)} pairs; expected once, or once per pair"
            )
    answer = answer * len(clean) if len(answer) == 1 else answer
    wrong = wrong * len(clean) if len(wrong) == 1 else wrong
    return [dict(zip(FIELDS, row)) for row in zip(clean, corrupted, answer, wrong)]


def encode_pairs(hm: HeadModel, pairs: list[dict], source: str) -> dict[str, list]:
    """The pairs as the model reads them: ``{"clean", "corrupted": P lists of L ids, "answer", "wrong": P ids}``.

    Every text encodes within the model, every pair has one token length (the same for all pairs), every
    answer and wrong token is one token and they differ — else a ``ValueError`` naming the pair."""
    length = None
    encoded: dict[str, list] = {f: [] for f in FIELDS}
    for k, pair in enumerate(pairs):
        where = f" (pair {k + 1} of {source})" if len(pairs) > 1 or source != "the options" else ""
        ids = {f: encode_text(hm, f"--{f}{where}", pair[f]) for f in ("clean", "corrupted")}
        if len(ids["clean"]) != len(ids["corrupted"]):
            raise ValueError(
                f"--corrupted{where}: {len(ids['corrupted'])} tokens, but --clean has {len(ids['clean'])}; "
                "patching swaps the same positions, so both texts must have the same token length"
            )
        if length is not None and len(ids["clean"]) != length:
            raise ValueError(
                f"--clean{where}: {len(ids['clean'])} tokens, but the first pair has {length}; the pairs run as one "
                "batch, so every text must have the same token length"
            )
        length = len(ids["clean"])
        a = encode_token(hm, f"--answer{where}", pair["answer"])
        w = encode_token(hm, f"--wrong{where}", pair["wrong"])
        if a == w:
            raise ValueError(
                f"--wrong{where}: {pair['wrong']!r} is the same token as --answer {pair['answer']!r} (id {a})"
            )
        for f, value in (("clean", ids["clean"]), ("corrupted", ids["corrupted"]), ("answer", a), ("wrong", w)):
            encoded[f].append(value)
    return encoded


@dataclass
class CircuitFound:
    """What :func:`circuit_study` found (rank 0): the :class:`~headwise.circuits.Circuit`, and under torchrun what
    the ranks did (``lines``, for the terminal)."""

    circuit: object
    lines: list[str] = field(default_factory=list)


def circuit_study(
    hm, clean, corrupted, *, answer, wrong, out: Path, stages: Callable = contextlib.nullcontext, **options
) -> CircuitFound | None:
    """:func:`headwise.circuits.find_circuit` on the prompt pairs ``clean`` / ``corrupted`` ``(P, L)`` (``answer``,
    ``wrong``: P ids; ``options``: its method, metric, ablation, …) — under torchrun the pairs split across the ranks
    (:func:`~headwise.study.circuit_across_ranks`, resumable from ``out``'s stages). ``stages()``: a context manager
    yielding rank 0's ``progress(stage, done, total)`` (the stages named as :data:`CIRCUIT_STEPS`). Returns None on
    ranks other than 0.

    Raises:
        ValueError: more ranks than pairs, a manifest of another run (one line); CollectiveTimeout: a stalled rank.
    """
    from headwise.circuits import find_circuit
    from headwise.distributed.ranks import first_rank, launched

    with stages() if first_rank() else contextlib.nullcontext() as progress:
        shown = None
        if progress is not None:
            shown = lambda stage, done, total: progress(CIRCUIT_STEPS.get(stage, stage), done, total)  # noqa: E731
        if not launched():
            return CircuitFound(
                find_circuit(hm, clean, corrupted, answer=answer, wrong=wrong, progress=shown, **options)
            )
        from headwise.study.circuit_ranks import circuit_across_ranks

        run = circuit_across_ranks(hm, clean, corrupted, answer=answer, wrong=wrong, progress=shown, out=out, **options)
        if run.circuit is None:  # not rank 0: rank 0 writes
            return None
        said = (
            f"{run.world_size} ranks, {clean.shape[0]} prompt pairs; {run.gathers} gathers, {run.payload_bytes} "
            "bytes received by each rank"
        )
        return CircuitFound(run.circuit, [said])


def circuit_heads(report: dict, n: int) -> list[dict]:
    """The circuit's head nodes, the ``n`` whose circuit edges (sent or received, the method's scores) weigh most."""
    method, edges = report["method"], report["edges"]
    weight: dict[str, float] = {}
    for index in report["circuit"]["edges"]:
        edge = edges[index]
        score = abs(edge["scores"].get(method) or 0.0)
        for end in (edge["sender"], edge["receiver"]):
            weight[end] = weight.get(end, 0.0) + score
    heads = [node for node in report["nodes"] if node["kind"] == "head" and node["id"] in weight]
    return sorted(heads, key=lambda node: -weight[node["id"]])[:n]


def add_qk(
    hm: HeadModel,
    report: dict,
    ids: list[int],
    n: int,
    *,
    warn: Callable[[str], None],
    progress: Callable[[str, int, int], None] | None = None,
) -> None:
    """``node_details[head]["qk"]``: the QK attribution (:func:`headwise.circuits.qk_attribution`) of the circuit's
    ``n`` strongest heads at the first clean prompt's last position (its top key), what the page shows on a click.
    A structure the attribution does not read leaves the page without it, said to ``warn`` in one line."""
    from headwise.circuits import qk_attribution

    say = progress or (lambda stage, done, total: None)
    heads = circuit_heads(report, n)
    details = report.setdefault("node_details", {})
    for done, node in enumerate(heads):
        say("QK attribution of the circuit's heads", done, len(heads))
        try:
            found = qk_attribution(hm, ids, node["layer"], node["head"], len(ids) - 1)
        except ValueError as e:
            warn(f"circuit.html without QK attribution: {said(e)}")
            return
        details.setdefault(node["id"], {})["qk"] = found.to_page()
    say("QK attribution of the circuit's heads", len(heads), len(heads))


def circuit_lines(found, report: dict, *, method: str, metric: str, ablation: str, exact_top: int) -> list[str]:
    """What the circuit says, for the terminal: both metrics, the circuit's size and what it recovers, the agreement of
    estimate and exact patch, the strongest edges (``method``, ``metric``, ``ablation``, ``exact_top``: the options)."""
    faith, chosen = report["faithfulness"], report["circuit"]
    recovered = chosen.get("recovered")
    lines = [
        f"metric ({metric}) clean {faith['clean_metric']:+.3f}, corrupted {faith['corrupted_metric']:+.3f}; "
        f"{len(report['edges'])} edges scored by {method}",
        f"circuit: {len(chosen['edges'])} edges, {len(chosen['nodes'])} nodes, recovering "
        + ("—" if recovered is None else f"{recovered:.3f}")
        + f" of the metric (asked {chosen['fraction']:g}, {ablation} ablation)",
    ]
    agreement = report.get("agreement")
    if agreement:
        lines.append(
            f"estimate vs exact on the top {exact_top}: Spearman {agreement['spearman']:.2f}, "
            f"top-{agreement['top_k']} overlap {agreement['overlap']:.2f}"
        )
    if report.get("mib"):
        lines += mib_lines(report["mib"])
    if report.get("bootstrap"):
        lines.append(bootstrap_line(report["bootstrap"]))
    top = found.top_edges(5)
    lines.append(
        "strongest edges: "
        + ", ".join(f"{e['sender']}→{e['receiver']}.{e['input']} {e['scores'][method]:+.3f}" for e in top)
    )
    return lines


def bootstrap_line(boot: dict) -> str:
    """The bootstrap for the terminal: the circuit's Jaccard across resamples of the pairs and its stable edges
    (``boot``: ``circuit.json``'s ``"bootstrap"``)."""
    from headwise.circuits.bootstrap import STABLE

    stable = "stable" if boot["circuit_jaccard"] >= STABLE_JACCARD else "not stable"
    return (
        f"bootstrap ({boot['resamples']} resamples of the {boot['pairs']} pairs): the {boot['size']}-edge circuit's "
        f"Jaccard with each resample's {boot['circuit_jaccard']:.2f} (least {_at(boot, 'jaccard_min'):.2f}, "
        f"between resamples {_at(boot, 'jaccard_pairwise'):.2f}) — {stable} by the ≥ {STABLE_JACCARD} bar; "
        f"{boot['stable_share']:.0%} of its edges in ≥ {STABLE:.0%} of the resamples; every edge's interval in "
        "circuit.json"
    )


def _at(boot: dict, key: str) -> float:
    """``boot[key]`` at the chosen circuit's size."""
    return boot[key][boot["sizes"].index(boot["size"])]


def mib_lines(mib: dict) -> list[str]:
    """MIB's curve for the terminal: the faithfulness at each fraction, CPR and CMD (``mib``: ``circuit.json``'s)."""
    shown = ", ".join(
        f"{100 * f:g}% {'—' if v is None else f'{v:.2f}'}" for f, v in zip(mib["fractions"], mib["faithfulness"])
    )
    areas = "—" if mib["cpr"] is None else f"CPR {mib['cpr']:.3f}, CMD {mib['cmd']:.3f}"
    return [f"MIB's curve (faithfulness at the fractions of the edges kept): {shown}; {areas}"]


#: the methods whose attribution splits a key/value group edge's score among the group's query heads
#: (``EdgeScores.shares``), which MIB's per-head k and v edges need under GQA
SHARED_METHODS: tuple[str, ...] = ("eap", "eap-ig", "atp*")


def check_mib(hm: HeadModel, method: str, option: str = "--mib") -> None:
    """Refuse, before any work, a run whose MIB files could not be written: a model MIB's graph cannot state
    (:func:`headwise.circuits.mib.mib_layout`), or GQA with a method that gives no shares (ValueError naming
    ``option``)."""
    from headwise.circuits import build_graph, wiring
    from headwise.circuits.mib import mib_layout

    graph = build_graph(wiring(hm))
    try:
        mib_layout(graph)
    except ValueError as e:
        raise ValueError(f"{option}: {e}") from None
    per = max(h // k for h, k in zip(graph.heads, graph.kv))
    if per > 1 and method not in SHARED_METHODS:
        raise ValueError(
            f"{option}: MIB scores k and v per query head, and this model's key/value groups are read by {per} query "
            f"heads each; method {method!r} does not split a group's score among its heads (no shares)"
        )


def write_mib(hm: HeadModel, circuit, folder: Path) -> list[str]:
    """The run's MIB files in ``folder`` (:func:`headwise.circuits.write_mib_dir`): its edges' scores as
    ``importances.json`` (``in_graph``: the circuit chosen) and the circuits at MIB's fractions. Returns the names."""
    import torch

    from headwise.circuits import build_graph, wiring, write_mib_dir
    from headwise.circuits.mib import model_width

    with layer_walk(hm):  # the anatomy of a model opened layer by layer (no weight is read)
        graph = build_graph(wiring(hm))
    chosen = torch.zeros(len(graph.edges), dtype=torch.bool)
    chosen[circuit.circuit["edges"]] = True
    scores = circuit.scores()
    return write_mib_dir(folder, graph, scores, circuit.shares, d_model=model_width(hm), in_graph=chosen)


def mib_evaluation(
    hm: HeadModel, clean, corrupted, *, answer, wrong, path: Path, option: str, progress=None, **options
) -> dict:
    """:func:`headwise.circuits.evaluate_mib` of the MIB-format file ``path`` on the prompt pairs ``clean`` /
    ``corrupted`` ``(P, L)`` (``answer``, ``wrong``: P ids; ``options``: metric, ablation, batch_size), errors naming
    ``option`` and the file; the report gains ``"file"``."""
    from headwise.circuits import evaluate_mib

    found = evaluate_mib(
        hm, clean, corrupted, answer=answer, wrong=wrong, data=str(path), source=f"{option} '{path}'",
        progress=progress, **options,
    )  # fmt: skip
    return {"file": str(path), **found}
