"""Why a head matters: activation patching, attribution patching and direct logit attribution, per head.

Shape legend: P prompt pairs, L length, V vocabulary, NL attention layers, H query heads, Dh head width.

On any model whose heads meet the output projection at a ``hook_heads`` point
(:mod:`headwise.core.hooks`): headwise's own modules and every Hugging Face model on headwise's attention
backend (:func:`as_target`).

- :func:`patch_heads` — every head patched alone (clean → corrupted, ``"denoise"``, or the opposite,
  ``"noise"``), the sweep batched; :func:`patch_positions` — chosen heads one position at a time;
  :func:`patch_set` — a set of heads together (:mod:`headwise.patching.exact`).
- :func:`attribution_patch` — the first-order estimate of the whole sweep from one forward and one backward
  pass (:mod:`headwise.patching.attribution`).
- :func:`direct_logit_attribution` — each head's, MLP's and the embeddings' direct share of a logit
  difference, the final norm's scale frozen; the parts add up to the logits
  (:mod:`headwise.patching.logit_attribution`).
- :func:`logit_difference` — the metric logit(answer) − logit(wrong) (:mod:`headwise.patching.metric`).

See ``docs/patching.md`` for the indirect-object experiment on SmolLM2-135M.
"""

from __future__ import annotations

from headwise.models.norms import FrozenNorm
from headwise.models.norms import freeze as _freeze
from headwise.patching.attribution import attribution_patch
from headwise.patching.exact import (
    DIRECTIONS,
    HeadCache,
    Patch,
    Patching,
    head_jobs,
    patch_heads,
    patch_positions,
    patch_set,
    position_jobs,
    run_batch,
    run_patched,
    run_with_cache,
    sweep_cost,
)
from headwise.patching.logit_attribution import LogitAttribution, direct_logit_attribution
from headwise.patching.metric import LogitDifference, logit_difference
from headwise.patching.recording import read_structure
from headwise.patching.residual_parts import ResidualParts, affine_weight, residual_parts
from headwise.patching.target import as_target


def freeze_norm(norm, x, y, what: str) -> FrozenNorm:
    """A norm frozen at a run: :func:`headwise.models.norms.freeze` (the anatomy's one way,
    ``hm.anatomy[l].attn_norm_frozen(x)`` for a layer's input norm)."""
    return _freeze(norm, x, y, what=what)


__all__ = [
    "DIRECTIONS",
    "FrozenNorm",
    "HeadCache",
    "LogitAttribution",
    "LogitDifference",
    "Patch",
    "Patching",
    "ResidualParts",
    "affine_weight",
    "as_target",
    "attribution_patch",
    "direct_logit_attribution",
    "freeze_norm",
    "head_jobs",
    "logit_difference",
    "patch_heads",
    "patch_positions",
    "patch_set",
    "position_jobs",
    "read_structure",
    "residual_parts",
    "run_batch",
    "run_patched",
    "run_with_cache",
    "sweep_cost",
]
