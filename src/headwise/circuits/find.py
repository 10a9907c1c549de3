"""``find_circuit``: edge scores, their exact check, the faithfulness curve and the smallest faithful circuit, in
one call (the library behind ``headwise circuit``).

Shape legend: P prompt pairs, L length, E edges.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from headwise.checks import one_of, positive_int
from headwise.circuits.areas import spearman
from headwise.circuits.bootstrap import bootstrap_circuit
from headwise.circuits.edges import edge_attribution
from headwise.circuits.faithfulness import ABLATIONS, faithfulness, smallest_circuit
from headwise.circuits.graph import Graph, build_graph
from headwise.circuits.metrics import METRICS, make_metric
from headwise.circuits.mib import mib_faithfulness, mib_report
from headwise.circuits.paths import patch_edges
from headwise.circuits.prompts import answer_ids, prompt_ids
from headwise.circuits.result import Circuit
from headwise.circuits.wiring import wiring
from headwise.patching.metric import LogitDifference
from headwise.points import layer_point

if TYPE_CHECKING:
    from headwise.models import HeadModel

__all__ = ["CIRCUIT_METHODS", "PairShard", "find_circuit", "spearman"]

CIRCUIT_METHODS = ("eap", "eap-ig", "atp*", "exact")
#: ``progress(stage, done, total)``, stage one of "attribution", "exact", "faithfulness", "circuit", "mib"
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class PairShard:
    """This process's share of the prompt pairs, in a run split across processes (one ``find_circuit`` call on each,
    every call handed all P pairs; :func:`headwise.study.circuit_across_ranks` builds it on ``torch.distributed``).

    Attributes:
        indices: the pairs this process computes (ascending indices into the P pairs; at least one).
        gather: ``fn(values (len(indices), …)) -> (P, …)``: every process's values of its own pairs, put in pair
            order — a collective: every process calls it at the same points with tensors of the same trailing shape.
        main: whether this process builds the parts of the result read from the first pair alone
            (``node_details``); the other processes leave them empty.
    """

    indices: tuple[int, ...]
    gather: Callable[[Tensor], Tensor]
    main: bool = True


def _node_details(target, graph: Graph, ids: Tensor, answer: int, wrong: int) -> dict:
    from headwise.patching import direct_logit_attribution

    names = [layer_point(layer, "attn.pattern") for layer in range(graph.num_layers)]
    cache = target.run_with_cache(ids, names=names)
    dla = direct_logit_attribution(target, ids, LogitDifference((answer,), (wrong,)))
    details: dict = {"embed": {"pattern": None, "direct_effect": float(dla.embed[0])}}
    for layer in range(graph.num_layers):
        pattern = cache[names[layer]][0].float()  # (H, L, S)
        for h in range(graph.heads[layer]):
            details[f"L{layer}.H{h}"] = {
                "pattern": [[round(float(v), 5) for v in row] for row in pattern[h]],
                "direct_effect": float(dla.heads[0, layer, h]),
            }
        if graph.mlps[layer]:
            details[f"L{layer}.MLP"] = {"pattern": None, "direct_effect": float(dla.mlp[0, layer])}
    return details


def find_circuit(
    hm: HeadModel,
    clean,
    corrupted,
    *,
    answer,
    wrong,
    method: str = "eap",
    steps: int = 5,
    metric: str = "logit_diff",
    ablation: str = "corrupted",
    fraction: float = 0.8,
    exact_top: int = 20,
    progress: Progress | None = None,
    batch_size: int | None = None,
    pairs: PairShard | None = None,
    stages: Callable[[str, Callable[[], object]], object] | None = None,
    shares: bool = False,
    bootstrap: int = 0,
    seed: int = 0,
) -> Circuit:
    """Find the edges that carry a behaviour from a set of prompt pairs, check them, and keep a faithful circuit.

    1. Score every edge of the graph (:mod:`headwise.circuits.graph`) by ``method``: EAP, EAP-IG
       (:func:`~headwise.circuits.edge_attribution`) or the exact patch of each edge alone
       (:func:`~headwise.circuits.patch_edges`, clean base, corrupted sender).
    2. Patch the ``exact_top`` edges of largest ``|estimate|`` exactly beside the estimate and state their
       agreement (Spearman's rank correlation, top-k overlap).
    3. The faithfulness curve: the top n edges kept, every other ablated
       (:func:`~headwise.circuits.faithfulness`), and the smallest circuit recovering ``fraction``.
    4. MIB's curve (:func:`~headwise.circuits.mib.mib_faithfulness`): the top ``int(f·E)`` edges for each of MIB's
       fractions, pruned as MIB prunes them, and its areas CPR and CMD (:mod:`headwise.circuits.areas`).

    Args:
        hm: a :class:`~headwise.models.HeadModel` (or anything :func:`headwise.patching.as_target` accepts).
        clean, corrupted: P prompt texts each (the same number of tokens everywhere), or token ids ``(P, L)``.
        answer, wrong: the answer and the wrong token per pair (texts of one token each, or ids; one value
            for every pair).
        method: ``"eap"``, ``"eap-ig"``, ``"atp*"`` (EAP with the query and key receivers' patterns recomputed
            exactly: :mod:`headwise.circuits.atp`) or ``"exact"``. steps: EAP-IG's interpolation steps.
        metric: ``"logit_diff"``, ``"prob"`` (the answer's probability) or ``"kl"`` (to the clean run; not with
            ``"eap"``, whose gradient vanishes there) at the last position.
        ablation: ``"corrupted"`` or ``"mean"`` (over the clean and corrupted prompts) for the edges left out.
        fraction: the share of the metric the chosen circuit must recover, in (0, 1].
        exact_top: edges patched exactly beside the estimate (0: none).
        progress: ``fn(stage, done, total)``, stage ``"attribution"``, ``"exact"``, ``"faithfulness"``, ``"mib"``.
        batch_size: jobs per forward pass (default 16 for exact patching, 8 for faithfulness).
        bootstrap: resamples of the prompt pairs (0: none; else at least 2): every edge's interval and the
            circuit's Jaccard across resamples at every size of the faithfulness curve, from the per-pair scores
            the run holds (:func:`~headwise.circuits.bootstrap.bootstrap_circuit`; no pass of the model).
            seed: the resamples' seed.
        shares: also split each key/value group edge's estimate among the group's query heads
            (:attr:`~headwise.circuits.EdgeScores.shares`, kept as :attr:`Circuit.shares` for MIB's files; the
            attribution stage then holds ``(P, E, G)``). Not with ``"exact"``.
        pairs: this process's share of the pairs when the run is split across processes (:class:`PairShard`):
            every per-pair value (the edges' scores, the exact patches, the curve's and the bisection's metrics) is
            computed on its pairs and gathered before any mean, so every process holds the one-process means and
            chooses the same top edges; the result equals the one-process run's up to the float32 rounding of
            rows run in batches of another size. None: every pair here.
        stages: a resumable run's hold on the four stages, ``stages(name, work)`` → what ``work()`` returns,
            computed or kept from an earlier run (:func:`headwise.study.circuit_across_ranks`): ``"attribution"`` →
            ``(P, E)`` every pair's edge scores (method ``"exact"``: patched − base), ``"exact"`` → ``(P, J)`` every
            pair's exact patches of the top J edges (patched − base), ``"faithfulness"`` → the
            :class:`~headwise.circuits.Faithfulness` curve, ``"circuit"`` → ``(n, recovered)`` of
            :func:`~headwise.circuits.smallest_circuit`, ``"mib"`` → MIB's :class:`~headwise.circuits.Faithfulness`
            curve. Default: ``work()``.
    Returns:
        :class:`~headwise.circuits.Circuit` (``to_dict()`` is ``circuit.json``).
    Raises:
        ValueError / TypeError: naming the argument — prompts of different lengths, an answer of several
        tokens, an unknown method, metric or ablation, ``"kl"`` with ``"eap"``, a bad fraction or batch size, a
        model structure the tracing does not read.
    """
    t0 = time.perf_counter()
    batch_size, steps = _checked(method, metric, ablation, fraction, exact_top, batch_size, steps)
    if isinstance(bootstrap, bool) or not isinstance(bootstrap, int) or bootstrap < 0 or bootstrap == 1:
        raise ValueError(f"bootstrap: expected 0 (none) or at least 2 resamples, got {bootstrap!r}")
    run = _pairs_run(hm, clean, corrupted, answer, wrong, metric=metric, ablation=ablation, pairs=pairs)
    keep = stages if stages is not None else (lambda name, work: work())
    graph = build_graph(run.w)
    scored = _scored_edges(run, graph, method=method, steps=steps, shares=shares, exact_top=exact_top,
                           exact_batch=batch_size or 16, keep=keep, progress=progress)  # fmt: skip
    curves = _curves(run, scored.scores, fraction, ablation=ablation, batch_size=batch_size or 8, keep=keep,
                     progress=progress)  # fmt: skip
    found = _circuit(run, graph, scored, curves, method=method, metric=metric, ablation=ablation, steps=steps,
                     fraction=fraction, seconds=lambda: time.perf_counter() - t0)  # fmt: skip
    if bootstrap:
        sizes = [n for n in curves[0].sizes if n > 0]  # the faithfulness curve's (its empty circuit left out)
        found.add_bootstrap(bootstrap_circuit(scored.per_pair, sizes, max(1, len(found.circuit["edges"])),
                                              resamples=bootstrap, seed=seed))  # fmt: skip
        found.seconds = time.perf_counter() - t0
    return found


def _checked(method, metric, ablation, fraction, exact_top, batch_size, steps) -> tuple[int | None, int]:
    """:func:`find_circuit`'s options checked (ValueError / TypeError naming the argument); ``(batch_size, steps)``."""
    one_of("method", method, CIRCUIT_METHODS)
    one_of("metric", metric, METRICS)
    one_of("ablation", ablation, ABLATIONS)
    if metric == "kl" and method in ("eap", "atp*"):
        raise ValueError(
            f"metric: 'kl' has no gradient on the clean run, so {method} scores it 0; use method='eap-ig' or 'exact'"
        )
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ValueError(f"fraction: expected a number in (0, 1], got {fraction!r}")
    if isinstance(exact_top, bool) or not isinstance(exact_top, int) or exact_top < 0:
        raise ValueError(f"exact_top: expected a whole number ≥ 0, got {exact_top!r}")
    if batch_size is not None:
        batch_size = positive_int("batch_size", batch_size)
    if method == "eap-ig":
        steps = positive_int("steps", steps)
    return batch_size, steps


@dataclass
class _PairsRun:
    """The prompt pairs of one :func:`find_circuit` call as this process runs them.

    Attributes:
        w: the model's wiring; target: its patching view.
        c, x: ``(P', L)`` this process's clean and corrupted ids (P' = P without a :class:`PairShard`).
        c_all: ``(P, L)`` every pair's clean ids; a_all, w_all: every pair's answer and wrong ids.
        shown: ``{"clean", "corrupted", "answer", "wrong"}``: every pair's prompts as the result lists them.
        fn: the metric on this process's pairs; gather: their per-pair values put in pair order (a collective
            under a shard); reference: the mean ablation's runs (every pair's, under a shard), else None;
        main: whether this process builds the parts read from the first pair alone.
    """

    w: object
    target: object
    c: Tensor
    x: Tensor
    c_all: Tensor
    a_all: list
    w_all: list
    shown: dict
    fn: object
    gather: Callable[[Tensor], Tensor]
    reference: Tensor | None
    main: bool


def _pairs_run(hm: HeadModel, clean, corrupted, answer, wrong, *, metric: str, ablation: str, pairs) -> _PairsRun:
    """The pairs read against the model (ValueError naming the argument), this process's share taken, the metric
    made (``"kl"``: the clean run's last logits)."""
    w = wiring(hm)
    target = w.target
    c, c_shown = prompt_ids("clean", clean, target)
    x, x_shown = prompt_ids("corrupted", corrupted, target)
    if c.shape != x.shape:
        raise ValueError(f"corrupted: expected the clean prompts' shape {tuple(c.shape)}, got {tuple(x.shape)}")
    P = c.shape[0]
    a_ids, a_shown = answer_ids("answer", answer, P, target)
    w_ids, w_shown = answer_ids("wrong", wrong, P, target)
    c, x = c.to(target.device), x.to(target.device)
    gather, reference, main = _all_pairs, None, True
    c_all, a_all, w_all = c, a_ids, w_ids
    if pairs is not None:
        mine = _shard_indices(pairs, P)
        gather, main = pairs.gather, pairs.main
        if ablation == "mean":  # the mean over every pair's clean and corrupted runs, as one process takes it
            reference = torch.cat([c, x])
        c, x = c[mine], x[mine]
        a_ids, w_ids = [a_ids[p] for p in mine], [w_ids[p] for p in mine]
    clean_last = None
    if metric == "kl":
        with torch.no_grad():
            clean_last = target.logits(c, last_only=True)[:, -1]  # (P, V)
    fn = make_metric(metric, a_ids, w_ids, clean_last)
    shown = {"clean": c_shown, "corrupted": x_shown, "answer": a_shown, "wrong": w_shown}
    return _PairsRun(w, target, c, x, c_all, a_all, w_all, shown, fn, gather, reference, main)


def _stage(progress: Progress | None, name: str):
    """``progress`` of one stage as ``fn(done, total)`` (None: no progress)."""
    return None if progress is None else (lambda done, total: progress(name, done, total))


@dataclass
class _Scored:
    """Every edge's score over every pair ``(E,)``, the exact patches ``{edge: effect}``, the estimate's agreement
    with them (None: fewer than two, or method ``"exact"``), and the key/value group edges' shares ``(E, G)`` or
    None."""

    scores: Tensor
    exact: dict
    agreement: dict | None
    shares: Tensor | None
    per_pair: Tensor | None = None  # (P, E) every pair's scores (their mean is ``scores``)


def _scored_edges(run: _PairsRun, graph: Graph, *, method, steps, shares, exact_top, exact_batch, keep, progress):
    """Steps 1 and 2 of :func:`find_circuit`: every edge scored by ``method``, the strongest ``exact_top`` patched
    exactly beside the estimate (stages ``"attribution"`` and ``"exact"``)."""

    def exact_patches(edges: list, name: str) -> Tensor:  # (P, J) patched − base of every pair
        ex = patch_edges(run.w, run.c, run.x, run.fn, edges, batch_size=exact_batch, progress=_stage(progress, name))
        return _pair_effects(ex, run.gather)

    if method == "exact":
        per_pair = keep("attribution", lambda: exact_patches(graph.edges, "attribution"))
        scores = per_pair.mean(0)
        return _Scored(scores, {e: float(v) for e, v in enumerate(scores)}, None, None, per_pair)

    def attribution() -> Tensor:  # (P, E) every pair's scores, or (P, E, G) their shares
        est = edge_attribution(
            run.w, run.c, run.x, run.fn, method=method, steps=steps, shares=shares,
            progress=_stage(progress, "attribution"),
        )  # fmt: skip
        return run.gather(est.per_pair_shares if shares else est.per_pair)

    values, head_shares = keep("attribution", attribution), None
    if values.dim() == 3:  # every edge's shares of its query heads: they add up to its score
        head_shares, values = values.mean(0), values.sum(-1)
    scores = values.mean(0)  # (E,): est.scores, over every pair
    exact, agreement = {}, None
    if exact_top:
        top = torch.argsort(scores.abs(), descending=True, stable=True)[: min(exact_top, len(graph.edges))]
        top = top.tolist()  # EdgeScores.top of the scores over every pair: the same edges on every process
        effect = keep("exact", lambda: exact_patches([graph.edges[e] for e in top], "exact")).mean(0)
        exact = {e: float(v) for e, v in zip(top, effect)}
        if len(top) >= 2:
            k = max(1, min(10, len(top) // 2))
            a, b = scores[top], effect
            ta = set(torch.argsort(a.abs(), descending=True, stable=True)[:k].tolist())
            tb = set(torch.argsort(b.abs(), descending=True, stable=True)[:k].tolist())
            agreement = {"spearman": spearman(a, b), "top_k": k, "overlap": len(ta & tb) / k}
    return _Scored(scores, exact, agreement, head_shares, values)


def _curves(run: _PairsRun, scores: Tensor, fraction, *, ablation, batch_size, keep, progress):
    """Steps 3 and 4 of :func:`find_circuit`: the faithfulness curve, the smallest circuit recovering ``fraction`` and
    MIB's curve (stages ``"faithfulness"``, ``"circuit"``, ``"mib"``). Returns ``(curve, (n, recovered),
    mib_curve)``."""
    w, c, x, fn, reference, gather = run.w, run.c, run.x, run.fn, run.reference, run.gather
    curve = keep(
        "faithfulness",
        lambda: faithfulness(
            w, c, x, fn, scores, ablation=ablation, reference=reference, batch_size=batch_size,
            progress=_stage(progress, "faithfulness"), gather_pairs=gather,
        ),
    )  # fmt: skip
    chosen = keep(
        "circuit",
        lambda: smallest_circuit(w, c, x, fn, curve, fraction, reference=reference, gather_pairs=gather),
    )
    mib_curve = keep(
        "mib",
        lambda: mib_faithfulness(
            w, c, x, fn, scores, ablation=ablation, reference=reference, batch_size=batch_size,
            progress=_stage(progress, "mib"), gather_pairs=gather,
        ),
    )  # fmt: skip
    return curve, chosen, mib_curve


def _circuit(run: _PairsRun, graph: Graph, scored: _Scored, curves, *, method, metric, ablation, steps, fraction,
             seconds) -> Circuit:  # fmt: skip
    """The :class:`~headwise.circuits.Circuit` of the scored edges and the curves (``seconds()``: the run's time,
    read last)."""
    curve, (n, recovered), mib_curve = curves
    kept = sorted(curve.order[:n])
    nodes = sorted({graph.edges[e].sender for e in kept} | {graph.edges[e].receiver for e in kept})
    edges = []
    for e, edge in enumerate(graph.edges):
        s = {} if method == "exact" else {method: float(scored.scores[e])}
        if e in scored.exact:
            s["exact"] = scored.exact[e]
        edges.append({"sender": edge.sender, "receiver": edge.receiver, "input": edge.input, "scores": s})
    shown, P = run.shown, run.c_all.shape[0]
    prompts = [{k: shown[k][p] for k in ("clean", "corrupted", "answer", "wrong")} for p in range(P)]
    target = run.target
    return Circuit(
        model=target.name,
        method=method,
        metric=metric,
        ablation=ablation,
        steps=steps if method == "eap-ig" else None,
        prompts=prompts,
        tokens=target.token_texts(run.c_all[0].tolist()),
        nodes=[node.to_dict() for node in graph.nodes],
        edges=edges,
        agreement=scored.agreement,
        faithfulness={
            "sizes": curve.sizes,
            "recovered": [_finite(v) for v in curve.recovered.tolist()],
            "metric": [_finite(v) for v in curve.metric.mean(0).tolist()],
            "clean_metric": curve.clean_metric,
            "corrupted_metric": curve.corrupted_metric,
            "ablated_metric": curve.ablated_metric,
        },
        circuit={"fraction": float(fraction), "edges": kept, "nodes": nodes, "recovered": _finite(recovered)},
        mib={
            **mib_report(mib_curve, len(graph.edges)),
            "clean_metric": mib_curve.clean_metric,
            "ablated_metric": mib_curve.ablated_metric,
        },  # fmt: skip
        node_details=_node_details(target, graph, run.c_all[:1], run.a_all[0], run.w_all[0]) if run.main else {},
        seconds=seconds(),
        shares=scored.shares,
    )


def _all_pairs(values: Tensor) -> Tensor:
    return values


def _shard_indices(pairs: PairShard, P: int) -> list[int]:
    """A :class:`PairShard`'s indices, checked against the P pairs."""
    if not isinstance(pairs, PairShard):
        raise TypeError(f"pairs: expected a PairShard or None, got {type(pairs).__name__}")
    mine = list(pairs.indices)
    if not mine or mine != sorted(set(mine)) or not all(isinstance(p, int) and 0 <= p < P for p in mine):
        raise ValueError(f"pairs: expected ascending distinct pair indices in 0 … {P - 1}, got {mine}")
    return mine


def _pair_effects(ex, gather) -> Tensor:
    """``(P, J)`` the exact patches' patched − base of every pair (their mean over the pairs:
    :attr:`PathPatching.effect` after ``gather``)."""
    return gather(ex.patched) - gather(ex.base)[:, None]


def _finite(v: float) -> float | None:
    return None if v != v or v in (float("inf"), float("-inf")) else float(v)
