"""The flow of ``headwise circuit``: the circuit found on one process or across the ranks of a ``torchrun`` launch,
``circuit.json``'s report with the prompts as typed, and the QK attribution of the circuit's strongest heads that
``circuit.html`` shows on a click — everything the command writes but the pictures.

Shape legend: P prompt pairs, L tokens.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from headwise.models import HeadModel

__all__ = [
    "CIRCUIT_STEPS",
    "CircuitFound",
    "add_qk",
    "circuit_heads",
    "circuit_lines",
    "circuit_study",
    "check_mib",
    "mib_evaluation",
    "mib_lines",
    "write_mib",
]

#: What each stage of :func:`headwise.circuits.find_circuit` is called on a progress bar.
CIRCUIT_STEPS = {
    "attribution": "edges scored",
    "exact": "top edges patched exactly",
    "faithfulness": "faithfulness curve",
    "circuit": "smallest circuit",
    "mib": "MIB's curve",
}


@dataclass
class CircuitFound:
    """What :func:`circuit_study` found (rank 0): the :class:`~headwise.circuits.Circuit`, and under torchrun what
    the ranks did (``lines``, for the terminal)."""

    circuit: object
    lines: list[str] = field(default_factory=list)


def circuit_study(
    hm: HeadModel, clean, corrupted, *, answer, wrong, out: Path, stages: Callable = contextlib.nullcontext, **options
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
            warn(f"circuit.html without QK attribution: {' '.join(str(e).split())}")
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
    top = found.top_edges(5)
    lines.append(
        "strongest edges: "
        + ", ".join(f"{e['sender']}→{e['receiver']}.{e['input']} {e['scores'][method]:+.3f}" for e in top)
    )
    return lines


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
