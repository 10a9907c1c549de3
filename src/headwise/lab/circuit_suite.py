"""Ground truth for circuit methods: small models trained on tasks whose circuit is known by construction
(:mod:`headwise.lab.circuit_tasks`), the known circuit confirmed by exact patching of every edge, and every edge
method scored against it (``headwise lab circuits``; docs/circuits.md).

For each task:

1. **Train** the task's attention-only model (:func:`headwise.lab.trainer.train`, one seed for initialisation and
   data) and measure on held-out prompt pairs whether it solves the task (:data:`MIN_ACCURACY`).
2. **Fix the roles** — which head of a layer does each part of the job — by attention-pattern scores on held-out
   sequences (:func:`headwise.lab.circuit_tasks.role_heads`), and expand the known circuit's templates into edges
   of the graph (:func:`headwise.lab.circuit_tasks.expand_known`). Nothing measured by patching enters here.
3. **Confirm** by exact patching of every edge alone (:func:`headwise.circuits.patch_edges`: clean run, one edge's
   sender from the corrupted run, the logit difference answer − wrong at the last position). The known circuit is
   confirmed when (a) the model solves the held-out pairs (accuracy ≥ :data:`MIN_ACCURACY`), (b) its edges carry at
   least :data:`MIN_SHARE` of the summed ``|effect|`` of all edges, and (c) every known edge ranks within the
   exact top ``TOP_FACTOR · K`` (K known edges) by ``|effect|``. (b) says the known edges are most of what moves the
   answer; (c) that none of them is a passenger. Beside it, the known circuit's own faithfulness (its edges kept,
   every other ablated to the corrupted run) is reported.
4. **Score every method** — each of :data:`headwise.circuits.EDGE_METHODS` (read when the suite runs, so a method
   added there is scored too) and ``"exact"`` (the patches of step 3): the AUROC of recovering the known edges by
   ``|score|`` (:func:`headwise.circuits.areas.auroc`), MIB's CPR and CMD from the faithfulness at MIB's fractions
   of the edges (:func:`headwise.circuits.areas.curve_areas`), the share of the known edges in the method's top K,
   the stability of its top-K circuit across :data:`BOOTSTRAP` resamples of the pairs (its mean Jaccard with the
   run's, :func:`headwise.circuits.bootstrap_circuit`) and its wall time.

Shape legend: P prompt pairs, L length, E edges, K known edges.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from headwise import checks
from headwise._machine import cpu_name
from headwise.lab.circuit_tasks import DEFAULT_TASKS, TASKS, CircuitTask, expand_known, pattern_share, role_heads
from headwise.lab.trainer import TrainConfig, threads, train
from headwise.models.transformer_lm import TransformerLM

__all__ = [
    "MIN_ACCURACY", "MIN_SHARE", "TOP_FACTOR", "PAIRS", "suite_methods", "suite_tasks", "run_task", "run_suite",
    "table_lines",
]  # fmt: skip

#: (a) the share of held-out clean and corrupted prompts whose top prediction is their own answer
MIN_ACCURACY = 0.9
#: (b) the share of the summed exact |effect| of all edges that the known edges must carry
MIN_SHARE = 0.5
#: (c) every known edge within the exact top TOP_FACTOR · K
TOP_FACTOR = 2
#: prompt pairs patched; held-out pairs for the accuracy
PAIRS, ACCURACY_PAIRS = 16, 256
#: EAP-IG's interpolation steps
IG_STEPS = 5
#: resamples of the pairs for each method's bootstrap (its top-K circuit's Jaccard; :mod:`headwise.circuits.bootstrap`)
BOOTSTRAP = 200

Stage = Callable[[str, str], None]


def suite_methods() -> list[str]:
    """The methods scored: every edge-attribution method of :data:`headwise.circuits.EDGE_METHODS`, then
    ``"exact"``."""
    from headwise.circuits import EDGE_METHODS

    return [*EDGE_METHODS, "exact"]


def suite_tasks(option: str, text: str) -> list[str]:
    """Comma-separated task names as a list, each of :data:`TASKS` once; ValueError naming ``option`` otherwise."""
    names = [t.strip() for t in str(text).split(",") if t.strip()]
    if not names or any(n not in TASKS for n in names) or len(set(names)) != len(names):
        raise ValueError(f"{option}: expected distinct names among {', '.join(TASKS)}, got {text!r}")
    return names


def _stream(seed: int, which: int) -> np.random.Generator:
    """Seed's stream ``which``: 1 held-out accuracy pairs, 2 role probes, 3 the patched pairs (0: training)."""
    return np.random.default_rng([seed, which])


def _num(v) -> float | None:
    v = float(v)
    return None if math.isnan(v) or math.isinf(v) else v


def _accuracy(model: TransformerLM, task: CircuitTask, seed: int) -> float:
    """The share of held-out clean and corrupted prompts whose top prediction at the last position is their answer."""
    clean, corrupted, answer, wrong = task.pairs(_stream(seed, 1), ACCURACY_PAIRS)
    with torch.no_grad():
        hit_c = model(clean)[:, -1].argmax(-1) == torch.tensor(answer)
        hit_x = model(corrupted)[:, -1].argmax(-1) == torch.tensor(wrong)
    return float(torch.cat([hit_c, hit_x]).float().mean())


def _roles(model: TransformerLM, task: CircuitTask, seed: int) -> dict:
    """Each role's layer, every head's pattern score on held-out sequences and the heads that take it."""
    ids, keys = task.probe(_stream(seed, 2), 128)
    with torch.no_grad():
        _, weights = model(ids, need_weights=True)  # [(B, H, L, L)] * N
    out = {}
    for role, (layer, what) in task.roles.items():
        scores = pattern_share(weights[layer], keys[role])
        out[role] = {"layer": layer, "score": what, "scores": scores, "heads": role_heads(scores)}
    return out


def _train(task: CircuitTask, seed: int, steps: int | None, num_threads: int | None, callback) -> tuple:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TransformerLM(task.model)
    n = task.steps if steps is None else checks.positive_int("steps", steps)
    config = TrainConfig(steps=n, lr=task.lr, warmup=min(task.warmup, n // 2), seed=seed, eval_every=n)
    result = train(
        model, lambda rng: task.batch(rng, task.batch_size), config, callback=callback, num_threads=num_threads
    )
    return model, config, result


@dataclass(frozen=True)
class _Bench:
    """What one task's methods are confirmed and scored on: the trained model's wiring and edge graph, the known
    circuit's edges (their names and indices into the graph, ``truth`` a bool ``(E,)``), and the prompt pairs with
    their metric (the logit difference answer − wrong)."""

    w: object
    graph: object
    known: list
    known_idx: list[int]
    truth: Tensor
    clean: Tensor
    corrupted: Tensor
    metric: Callable


def _bench(model: TransformerLM, task: CircuitTask, seed: int, roles: dict) -> _Bench:
    """Step 2's edges and step 3's pairs: the known circuit's templates expanded by the roles found, on the graph
    of the model's wiring; :data:`PAIRS` prompt pairs from their own stream."""
    from headwise.circuits import build_graph, make_metric, wiring

    known = expand_known(task.known, {r: v["heads"] for r, v in roles.items()})
    w = wiring(model)
    graph = build_graph(w)
    E = len(graph.edges)
    known_idx = [graph.edge("known", e) for e in known]
    truth = torch.zeros(E, dtype=torch.bool)
    truth[known_idx] = True
    clean, corrupted, answer, wrong = task.pairs(_stream(seed, 3), PAIRS)
    metric = make_metric("logit_diff", answer, wrong)
    return _Bench(w, graph, known, known_idx, truth, clean, corrupted, metric)


def _confirm(bench: _Bench, accuracy: float) -> tuple:
    """Step 3: exact patching of every edge alone, and whether it confirms the known circuit. Returns ``(the
    patching's result, its seconds, the "confirmation" entry of the task's dict)``."""
    from headwise.circuits import faithfulness, patch_edges

    w, graph, known, truth = bench.w, bench.graph, bench.known, bench.truth
    E, K = len(graph.edges), len(known)
    t = time.perf_counter()
    exact = patch_edges(w, bench.clean, bench.corrupted, bench.metric, graph.edges)
    exact_seconds = time.perf_counter() - t
    effect = exact.effect  # (E,) patched − clean, mean over pairs
    size = effect.abs()
    order = torch.argsort(size, descending=True, stable=True).tolist()
    rank = {e: order.index(e) + 1 for e in range(E)}
    known_ranks = {name: rank[e] for name, e in zip(known, bench.known_idx)}
    total = float(size.sum())
    share = float(size[truth].sum()) / total if total > 0 else math.nan
    known_curve = faithfulness(w, bench.clean, bench.corrupted, bench.metric, truth.float(), sizes=[K])
    top = TOP_FACTOR * K
    checks_passed = {
        "accuracy": accuracy >= MIN_ACCURACY,
        "share": share >= MIN_SHARE,
        "ranks": max(known_ranks.values()) <= top,
    }
    confirmation = {
        "share": _num(share),
        "known_ranks": known_ranks,
        "top": top,
        "known_recovered": _num(known_curve.recovered[-1]),
        "exact_top": [(graph.edges[e].name, float(effect[e])) for e in order[: max(top, 10)]],
        "criteria": {"min_accuracy": MIN_ACCURACY, "min_share": MIN_SHARE, "top_factor": TOP_FACTOR},
        "checks": checks_passed,
        "confirmed": all(checks_passed.values()),
    }
    return exact, exact_seconds, confirmation


def _score(bench: _Bench, method: str, exact, exact_seconds: float, seed: int) -> dict:
    """Step 4 for one method (``"exact"``: the patches of step 3, ``exact``, timed there): its AUROC, CPR, CMD,
    top-K recall, faithfulness at MIB's sizes, its top-K circuit's stability across resamples of the pairs and its
    wall time."""
    from headwise.circuits import bootstrap_circuit, edge_attribution, faithfulness
    from headwise.circuits.areas import MIB_FRACTIONS, auroc, curve_areas, mib_sizes

    w, clean, corrupted, metric, truth = bench.w, bench.clean, bench.corrupted, bench.metric, bench.truth
    E, K = len(bench.graph.edges), len(bench.known)
    if method == "exact":
        per_pair, s, seconds = exact.per_pair, exact.effect, exact_seconds  # (P, E) patched − clean, its mean
    else:
        t = time.perf_counter()
        kw = {"steps": IG_STEPS} if method == "eap-ig" else {}
        found = edge_attribution(w, clean, corrupted, metric, method=method, **kw)
        s, per_pair = found.scores, found.per_pair
        seconds = time.perf_counter() - t
    boot = bootstrap_circuit(per_pair, [K], K, resamples=BOOTSTRAP, seed=seed)
    sizes = mib_sizes(E)
    curve = faithfulness(w, clean, corrupted, metric, s, sizes=sizes)
    recovered = curve.recovered[len(curve.sizes) - len(sizes) :].tolist()
    cpr, cmd = curve_areas(recovered, MIB_FRACTIONS)
    mine = set(torch.argsort(s.abs(), descending=True, stable=True)[:K].tolist())
    return {
        "auroc": _num(auroc(s, truth)),
        "cpr": _num(cpr),
        "cmd": _num(cmd),
        "top_k_recall": len(mine & set(truth.nonzero()[:, 0].tolist())) / K,
        "faithfulness": {"sizes": sizes, "recovered": [_num(v) for v in recovered]},
        "bootstrap": {"resamples": BOOTSTRAP, "size": K, "jaccard": boot["circuit_jaccard"],
                      "jaccard_pairwise": boot["jaccard_pairwise"][0], "stable_share": boot["stable_share"]},
        "seconds": seconds,
    }  # fmt: skip


def run_task(
    task: CircuitTask | str,
    *,
    seed: int = 0,
    steps: int | None = None,
    num_threads: int | None = 1,
    callback=None,
    stage: Stage | None = None,
) -> dict:
    """Train one task's model, confirm its known circuit by exact patching, and score every method against it.

    Args:
        task: a :class:`~headwise.lab.circuit_tasks.CircuitTask` or its name in :data:`TASKS`.
        seed: seeds the initialisation, the training data and (as other streams) the probes and pairs.
        steps: training steps (None: the task's).
        num_threads: torch threads for the whole run (None: as set).
        callback: the trainer's, after every step (:class:`headwise.lab.trainer.Progress`).
        stage: ``fn(task name, what)`` as each stage begins.
    Returns:
        a JSON-ready dict: the task, the model, training, ``accuracy``, ``roles``, ``known`` (templates and
        edges), ``pairs`` (P, L, the metric's clean and corrupted means), ``confirmation`` (the numbers, the
        criteria, ``confirmed``) and ``methods`` (``{method: {auroc, cpr, cmd, top_k_recall, faithfulness,
        seconds}}``).
    """
    if isinstance(task, str):
        checks.one_of("task", task, tuple(TASKS))
        task = TASKS[task]
    checks.non_negative_int("seed", seed)
    say = stage or (lambda name, what: None)
    t0 = time.perf_counter()
    with threads(num_threads):
        say(task.name, f"training ({task.steps if steps is None else steps} steps)")
        model, config, trained = _train(task, seed, steps, None, callback)
        accuracy = _accuracy(model, task, seed)
        roles = _roles(model, task, seed)
        bench = _bench(model, task, seed, roles)
        say(task.name, f"exact patching of all {len(bench.graph.edges)} edges")
        exact, exact_seconds, confirmation = _confirm(bench, accuracy)
        scores: dict = {}
        for method in suite_methods():
            say(task.name, f"scoring {method}")
            scores[method] = _score(bench, method, exact, exact_seconds, seed)
    graph, known, clean = bench.graph, bench.known, bench.clean
    E = len(graph.edges)
    m_clean, m_corr = float(exact.metric_clean.mean()), float(exact.metric_corrupted.mean())
    return {
        "task": task.name,
        "description": task.description,
        "mechanism": task.mechanism,
        "model": task.model.to_dict(),
        "parameters": model.num_parameters(),
        "train": {**config.to_dict(), "batch_size": task.batch_size, "seconds": trained.seconds},
        "accuracy": accuracy,
        "roles": roles,
        "known": {"templates": list(task.known), "edges": known},
        "graph": {"edges": E, "senders": len(graph.senders), "receivers": len(graph.receivers)},
        "pairs": {"count": PAIRS, "length": int(clean.shape[1]), "metric": "logit_diff",
                  "metric_clean": m_clean, "metric_corrupted": m_corr},
        "confirmation": confirmation,
        "methods": scores,
        "seconds": time.perf_counter() - t0,
    }  # fmt: skip


def run_suite(
    tasks=None,
    *,
    seed: int = 0,
    steps: int | None = None,
    num_threads: int | None = 1,
    callback=None,
    stage: Stage | None = None,
) -> dict:
    """:func:`run_task` for each task, in order: the contents of ``circuits.json``.

    Args:
        tasks: names from :data:`TASKS` (None: :data:`~headwise.lab.circuit_tasks.DEFAULT_TASKS`).
        seed, steps, num_threads, callback, stage: as :func:`run_task`.
    Returns:
        ``{"seed", "threads", "cpu", "methods", "fractions", "criteria", "tasks": {name: run_task's dict},
        "seconds"}``.
    Raises:
        ValueError: an unknown or repeated task name, none at all.
    """
    from headwise.circuits.areas import MIB_FRACTIONS

    checks.non_negative_int("seed", seed)
    names = list(DEFAULT_TASKS) if tasks is None else suite_tasks("tasks", ",".join(map(str, tasks)))
    t0 = time.perf_counter()
    runs = {
        n: run_task(n, seed=seed, steps=steps, num_threads=num_threads, callback=callback, stage=stage) for n in names
    }
    return {
        "suite": "circuits",
        "seed": seed,
        "threads": torch.get_num_threads() if num_threads is None else num_threads,
        "cpu": cpu_name(),
        "methods": suite_methods(),
        "fractions": list(MIB_FRACTIONS),
        "criteria": {"min_accuracy": MIN_ACCURACY, "min_share": MIN_SHARE, "top_factor": TOP_FACTOR},
        "tasks": runs,
        "seconds": time.perf_counter() - t0,
    }


def table_lines(result: dict) -> list[str]:
    """The suite's table for the terminal: per task its confirmation, then per method AUROC, CPR, CMD, top-K recall,
    its top-K circuit's bootstrap Jaccard and seconds."""
    lines = []
    for name, r in result["tasks"].items():
        c = r["confirmation"]
        verdict = "confirmed" if c["confirmed"] else "NOT CONFIRMED (" + ", ".join(
            k for k, ok in c["checks"].items() if not ok
        ) + ")"  # fmt: skip
        share = "n/a" if c["share"] is None else f"{c['share']:.2f}"
        lines.append(
            f"{name}: {verdict}; accuracy {r['accuracy']:.3f}, known edges {len(r['known']['edges'])} of "
            f"{r['graph']['edges']} carry {share} of the exact |effect|, worst rank {max(c['known_ranks'].values())} "
            f"(≤ {c['top']}), alone they recover {_fmt(c['known_recovered'])}"
        )
        for method, m in r["methods"].items():
            lines.append(
                f"  {method:8s} AUROC {_fmt(m['auroc'])}  CPR {_fmt(m['cpr'])}  CMD {_fmt(m['cmd'])}  "
                f"top-K recall {m['top_k_recall']:.2f}  bootstrap Jaccard {_fmt(m['bootstrap']['jaccard'])}  "
                f"{m['seconds']:.2f} s"
            )
    return lines


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.3f}"
