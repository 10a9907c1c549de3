"""How heads work together: paths and edges between heads, why a head attends where it does.

Shape legend: P prompt pairs, L length, V vocabulary, NL attention layers, H query heads, Hkv key/value heads,
Dh head width, D model width.

Built on the one model view (:class:`headwise.models.HeadModel`) and its named points (:mod:`headwise.points`);
above :mod:`headwise.patching` (it reuses its metrics and sweeps), below ``study/``, ``viz/`` and ``cli/``.
"""

from __future__ import annotations

__all__: list[str] = []

# -- paths, edges and faithfulness (docs/circuits.md) ------------------------------------------------------------
from headwise.circuits.edges import EDGE_METHODS, EdgeScores, edge_attribution  # noqa: E402
from headwise.circuits.faithfulness import ABLATIONS, Faithfulness, faithfulness, smallest_circuit  # noqa: E402
from headwise.circuits.find import CIRCUIT_METHODS, find_circuit  # noqa: E402
from headwise.circuits.graph import Edge, Graph, Node, build_graph  # noqa: E402
from headwise.circuits.metrics import METRICS, AnswerProbability, KLToClean, make_metric  # noqa: E402
from headwise.circuits.paths import PathPatching, patch_edges, path_patch  # noqa: E402
from headwise.circuits.result import Circuit  # noqa: E402
from headwise.circuits.wiring import Wiring, wiring  # noqa: E402

__all__ += [
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
    "PathPatching",
    "Wiring",
    "build_graph",
    "edge_attribution",
    "faithfulness",
    "find_circuit",
    "make_metric",
    "patch_edges",
    "path_patch",
    "smallest_circuit",
    "wiring",
]
