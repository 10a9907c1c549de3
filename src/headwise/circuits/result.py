"""A found circuit: the graph, every edge's scores, the exact check, the faithfulness curve and the circuit kept.

Shape legend: P prompt pairs, L length, NL layers, H query heads, E edges.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Circuit"]


@dataclass
class Circuit:
    """What :func:`headwise.circuits.find_circuit` found; :meth:`to_dict` is the ``circuit.json`` contents.

    ``to_dict()`` keys (every float a JSON number, NaN as null):

    - ``"model"`` (the model's name), ``"method"`` (``"eap"``, ``"eap-ig"``, ``"atp*"`` or ``"exact"``), ``"metric"``
      (``"logit_diff"``, ``"prob"`` or ``"kl"``), ``"ablation"`` (``"corrupted"`` or ``"mean"``), ``"steps"``
      (EAP-IG's steps, else null);
    - ``"prompts"``: one ``{"clean", "corrupted", "answer", "wrong"}`` per pair (texts, or token ids as lists
      where ids were given);
    - ``"tokens"``: the first clean prompt's tokens as the text each adds (:mod:`headwise.models.token_text`);
    - ``"nodes"``: ``{"id", "kind", "layer", "head", "kv_group", "heads"}`` each — kind ``embed``, ``head``,
      ``kv`` (a key/value group; ``heads`` the query heads that read it), ``mlp`` or ``logits``
      (:mod:`headwise.circuits.graph`);
    - ``"edges"``: ``{"sender", "receiver", "input", "scores"}`` each — input ``q``, ``k``, ``v``, ``mlp`` or
      ``logits``; ``scores`` ``{method: value}``: the estimate (``"eap"`` / ``"eap-ig"`` / ``"atp*"``: metric(edge
      corrupted) − metric(clean), mean over pairs) and ``"exact"`` where the edge was patched exactly;
    - ``"agreement"``: ``{"spearman", "top_k", "overlap"}`` between the estimate and the exact patch over the
      exactly patched edges (Spearman's rank correlation; the share of the top ``top_k`` by ``|score|`` that
      both put there), or null (``method="exact"``, or fewer than 2 edges patched);
    - ``"faithfulness"``: ``{"sizes", "recovered", "metric", "clean_metric", "corrupted_metric",
      "ablated_metric"}`` — the top-n circuits by ``|score|`` (n in ``sizes``), every other edge ablated, and the
      fraction of the metric they recover (:mod:`headwise.circuits.faithfulness`);
    - ``"circuit"``: ``{"fraction", "edges", "nodes", "recovered"}`` — the smallest top-n circuit recovering
      ``fraction``: its edge indices (into ``"edges"``), the nodes they touch, what it recovers;
    - ``"mib"``: ``{"fractions", "sizes", "edges", "faithfulness", "cpr", "cmd", "clean_metric", "ablated_metric"}``
      — MIB's curve (:func:`headwise.circuits.mib.mib_report`): for each of MIB's fractions f the top ``int(f·E)``
      edges (``sizes``), pruned to the ``edges`` on a path from the embeddings to the logits as MIB prunes them, their
      faithfulness, and its areas CPR (higher is better) and CMD (lower), by MIB's trapezoids over the fractions;
    - ``"bootstrap"`` (``find_circuit(bootstrap=B)``; else null): the pairs resampled B times
      (:mod:`headwise.circuits.bootstrap`): ``resamples``, ``pairs``, ``seed``, ``interval`` (its percentiles),
      ``sizes``, ``jaccard`` / ``jaccard_min`` (each resample's top-n circuit against the run's, at every size),
      ``jaccard_pairwise`` (between resamples), ``size``, ``circuit_jaccard`` and ``stable_share`` (the chosen
      circuit's edges held by at least 90 % of the resamples' circuits of its size); and every edge gains
      ``"interval"`` ([low, high] of its score) and ``"survival"`` (the share of the resamples' circuits of the chosen
      size that hold it);
    - ``"node_details"``: ``{node id: {"pattern", "direct_effect"}}`` — ``pattern`` a head's attention weights
      on the first clean prompt (L lists of L floats; heads only), ``direct_effect`` the node's direct logit
      attribution to logit(answer) − logit(wrong) on that prompt (heads, MLPs, the embeddings;
      :func:`headwise.patching.direct_logit_attribution`).
    """

    model: str
    method: str
    metric: str
    ablation: str
    steps: int | None
    prompts: list[dict]
    tokens: list[str]
    nodes: list[dict]
    edges: list[dict]
    agreement: dict | None
    faithfulness: dict
    circuit: dict
    node_details: dict = field(default_factory=dict)
    seconds: float = 0.0
    mib: dict | None = None
    #: ``(E, G)`` each edge's score split among the query heads that read it (``EdgeScores.shares``), or None
    shares: object = None
    #: the bootstrap's summary (:meth:`add_bootstrap`), or None
    bootstrap: dict | None = None

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "method": self.method,
            "metric": self.metric,
            "ablation": self.ablation,
            "steps": self.steps,
            "prompts": self.prompts,
            "tokens": self.tokens,
            "nodes": self.nodes,
            "edges": self.edges,
            "agreement": self.agreement,
            "faithfulness": self.faithfulness,
            "circuit": self.circuit,
            "mib": self.mib,
            "bootstrap": self.bootstrap,
            "node_details": self.node_details,
        }

    def add_bootstrap(self, report: dict) -> None:
        """A :func:`~headwise.circuits.bootstrap.bootstrap_circuit` report kept: its summary as ``bootstrap``, each
        edge's interval and survival on the edge."""
        low, high, survival = report["low"], report["high"], report["survival"]
        for e, edge in enumerate(self.edges):
            edge["interval"] = [_number(low[e]), _number(high[e])]
            edge["survival"] = round(float(survival[e]), 4)
        self.bootstrap = {k: v for k, v in report.items() if k not in ("low", "high", "survival")}

    def scores(self, method: str | None = None):
        """``(E,)`` every edge's ``method`` score (default: this circuit's method); NaN where missing."""
        import torch

        method = method or self.method
        return torch.tensor([e["scores"].get(method, float("nan")) for e in self.edges], dtype=torch.float32)

    def top_edges(self, n: int, method: str | None = None) -> list[dict]:
        """The ``n`` edges of largest ``|score|`` by ``method`` (default: this circuit's method)."""
        method = method or self.method
        scored = [e for e in self.edges if e["scores"].get(method) is not None]
        return sorted(scored, key=lambda e: -abs(e["scores"][method]))[:n]

    @property
    def circuit_edges(self) -> list[dict]:
        """The chosen circuit's edges."""
        return [self.edges[i] for i in self.circuit["edges"]]


def _number(v) -> float | None:
    """A JSON number: None for NaN / inf."""
    v = float(v)
    return v if v == v and v not in (float("inf"), float("-inf")) else None
