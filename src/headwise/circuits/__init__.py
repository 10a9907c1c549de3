"""How heads work together: paths and edges between heads, why a head attends where it does.

Shape legend: P prompt pairs, L length, V vocabulary, NL attention layers, H query heads, Hkv key/value heads,
Dh head width, D model width.

Built on the one model view (:class:`headwise.models.HeadModel`) and its named points (:mod:`headwise.points`);
above :mod:`headwise.patching` (it reuses its metrics and sweeps), below ``study/``, ``viz/`` and ``cli/``.
"""

from __future__ import annotations

# -- why a head attends and the weights' circuits (docs/qk.md); paths, edges, faithfulness and stability
# (docs/circuits.md) --
from headwise.circuits.addresses import Receiver, Write
from headwise.circuits.bootstrap import bootstrap_circuit
from headwise.circuits.composition import (
    CompositionScores,
    CopyingScores,
    HeadWeights,
    composition_scores,
    copying_scores,
    head_weights,
    ov_top_tokens,
    qk_top_pairs,
)
from headwise.circuits.composition_layers import weights_circuits
from headwise.circuits.edges import EDGE_METHODS, EdgeScores, edge_attribution
from headwise.circuits.faithfulness import ABLATIONS, Faithfulness, faithfulness, smallest_circuit
from headwise.circuits.find import CIRCUIT_METHODS, PairShard, find_circuit
from headwise.circuits.graph import Edge, Graph, Node, build_graph
from headwise.circuits.metrics import METRICS, AnswerProbability, KLToClean, make_metric
from headwise.circuits.mib import evaluate_mib, from_mib, read_mib, to_mib, write_mib_dir
from headwise.circuits.paths import PathPatching, patch_edges, path_patch
from headwise.circuits.qk import QKAttribution, qk_attribution
from headwise.circuits.result import Circuit
from headwise.circuits.wiring import Wiring, wiring

__all__ = [
    "ABLATIONS",
    "AnswerProbability",
    "CIRCUIT_METHODS",
    "Circuit",
    "EDGE_METHODS",
    "Edge",
    "EdgeScores",
    "Faithfulness",
    "Graph",
    "KLToClean",
    "METRICS",
    "Node",
    "PairShard",
    "PathPatching",
    "Receiver",
    "Wiring",
    "Write",
    "bootstrap_circuit",
    "build_graph",
    "edge_attribution",
    "evaluate_mib",
    "from_mib",
    "faithfulness",
    "find_circuit",
    "make_metric",
    "patch_edges",
    "path_patch",
    "read_mib",
    "smallest_circuit",
    "to_mib",
    "wiring",
    "write_mib_dir",
    "CompositionScores",
    "CopyingScores",
    "HeadWeights",
    "QKAttribution",
    "composition_scores",
    "copying_scores",
    "head_weights",
    "ov_top_tokens",
    "qk_attribution",
    "qk_top_pairs",
    "weights_circuits",
]
