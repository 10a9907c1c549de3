"""How heads work together: paths and edges between heads, why a head attends where it does.

Shape legend: P prompt pairs, L length, V vocabulary, NL attention layers, H query heads, Hkv key/value heads,
Dh head width, D model width.

Built on the one model view (:class:`headwise.models.HeadModel`) and its named points (:mod:`headwise.points`);
above :mod:`headwise.patching` (it reuses its metrics and sweeps), below ``study/``, ``viz/`` and ``cli/``.
"""

from __future__ import annotations

# QK attribution and the weights' circuits
from headwise.circuits.composition import (  # noqa: E402
    CompositionScores,
    CopyingScores,
    HeadWeights,
    composition_scores,
    copying_scores,
    head_weights,
    ov_top_tokens,
    qk_top_pairs,
)
from headwise.circuits.qk import QKAttribution, qk_attribution  # noqa: E402

__all__: list[str] = []
__all__ += [
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
]
