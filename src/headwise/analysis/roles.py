"""Role labels for attention heads, from their corpus-averaged metrics, with stated thresholds.

Shape legend: NL layers, H heads per layer.

The rules (:class:`RoleThresholds`, defaults in brackets):

1. **Share roles.** Each head has six shares in [0, 1] (see :mod:`headwise.analysis.targets`):
   attention to the previous token, the next token, itself, [CLS], [SEP] and punctuation. Every share
   at or above its threshold — ``position`` [0.5] for previous / next / self, ``sink`` [0.5] for [CLS] /
   [SEP] / punctuation — makes the head a candidate for that role. The numbers follow Clark et al.
   2019, who single out heads that "put >50% of their attention on the previous token" and note that
   "often more than half of a head's total attention is to these [special] tokens".
2. The head gets the candidate role with the **largest share** (ties: the order of ``SHARE_ROLES``).
3. Otherwise it is **broad** when its entropy ratio (mean row entropy / ln n, see
   :mod:`headwise.analysis.entropy`) is at least ``broad`` [0.8]: close to uniform attention, which is
   how Clark et al. describe their high-entropy lower-layer heads ("at most 10% of their attention mass
   on any single word", a "bag-of-vectors").
4. Otherwise **other**.

Decoders (:func:`decoder_roles`; metrics of :mod:`headwise.analysis.decoder`) have no [CLS], [SEP] or
next token; their rules, in order:

1. **Pattern roles**: *induction* when the induction score on the probe of repeated random tokens is
   ≥ ``induction`` [0.4]; *duplicate-token* when the probe's duplicate score is ≥ ``duplicate`` [0.4];
   *previous-token* when ``prev`` (on the text) is ≥ ``position`` [0.5]. The largest qualifying score
   wins (ties: that order). On the probe, a causal head spreading its attention evenly puts about 1/i
   on a target at query i (under 0.03 for the default 32-token segment): 0.4 is more than ten times that.
2. Otherwise **first-token sink** when ``first`` (on the text) is ≥ ``sink`` [0.5] — the BOS sink that
   most trained decoders show; it comes after the pattern roles because many pattern heads park their
   spare attention on the first token too.
3. Otherwise **broad** when the causal entropy ratio (``entropy_ratio_causal``: each query's entropy
   over ln of the keys it may see, so that uniform attention over the visible prefix is 1) is ≥
   ``broad``, otherwise **other**.

Roles are empirical summaries of one model on one corpus, not mechanisms: a head labelled
"previous-token" on this corpus may do something else elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np

from headwise import checks

__all__ = ["RoleThresholds", "SHARE_ROLES", "DECODER_PATTERN_ROLES", "ROLES", "head_roles", "decoder_roles"]

#: (role label, metric name, threshold field) in tie-breaking order.
SHARE_ROLES = (
    ("previous-token", "prev", "position"),
    ("next-token", "next", "position"),
    ("self", "self", "position"),
    ("[CLS] sink", "cls", "sink"),
    ("[SEP] sink", "sep", "sink"),
    ("punctuation sink", "punct", "sink"),
)
#: Decoder pattern roles: (role label, metric name, threshold field) in tie-breaking order.
DECODER_PATTERN_ROLES = (
    ("induction", "induction_probe", "induction"),
    ("duplicate-token", "duplicate_probe", "duplicate"),
    ("previous-token", "prev", "position"),
)
#: The decoder sink role: (label, metric, threshold field).
DECODER_SINK_ROLE = ("first-token sink", "first", "sink")
#: Every label :func:`head_roles` or :func:`decoder_roles` can give.
ROLES = (
    tuple(r for r, _, _ in SHARE_ROLES) + ("induction", "duplicate-token", DECODER_SINK_ROLE[0]) + ("broad", "other")
)


@dataclass(frozen=True)
class RoleThresholds:
    """Thresholds of the role rules.

    Attributes:
        position: minimum share of attention to the previous / next token or to itself.
        sink: minimum share of attention to [CLS], [SEP] or punctuation.
        broad: minimum entropy ratio (entropy / ln n) of a broad head.
        induction: minimum induction score on the probe (decoders).
        duplicate: minimum duplicate-token score on the probe (decoders).
    """

    position: float = 0.5
    sink: float = 0.5
    broad: float = 0.8
    induction: float = 0.4
    duplicate: float = 0.4

    def __post_init__(self):
        for name, value in asdict(self).items():
            checks.number_in(name, value, 0, 1, low_closed=False, high_closed=True)


def head_roles(metrics: Mapping[str, np.ndarray], thresholds: RoleThresholds | None = None) -> np.ndarray:
    """Label every head with one role.

    Args:
        metrics: arrays of one shape (e.g. ``(NL, H)``) for the keys ``prev``, ``next``, ``self``,
            ``cls``, ``sep``, ``punct`` and ``entropy_ratio``; NaN counts as below every threshold.
        thresholds: the rule thresholds (default :class:`RoleThresholds`).
    Returns:
        An array of role strings (from :data:`ROLES`) of the metrics' shape.
    Raises:
        ValueError: a missing metric, or metrics of different shapes.
    """
    t = thresholds or RoleThresholds()
    needed = [m for _, m, _ in SHARE_ROLES] + ["entropy_ratio"]
    arrays = _arrays(metrics, needed)
    shape = arrays["prev"].shape
    scores = np.stack([arrays[m] for _, m, _ in SHARE_ROLES])  # (6, …)
    limits = np.array([getattr(t, f) for _, _, f in SHARE_ROLES]).reshape((-1,) + (1,) * len(shape))
    qualifies = scores >= limits
    best = np.argmax(np.where(qualifies, scores, -np.inf), axis=0)  # first maximum on ties
    share_label = np.array([r for r, _, _ in SHARE_ROLES], dtype=object)[best]
    out = np.where(arrays["entropy_ratio"] >= t.broad, "broad", "other").astype(object)
    out = np.where(qualifies.any(axis=0), share_label, out)
    return out.astype(str)


def _arrays(metrics: Mapping[str, np.ndarray], needed: list[str]) -> dict[str, np.ndarray]:
    missing = [m for m in needed if m not in metrics]
    if missing:
        raise ValueError(f"metrics: expected the keys {needed}, missing {missing}")
    arrays = {m: np.nan_to_num(np.asarray(metrics[m], dtype=np.float64), nan=-np.inf) for m in needed}
    shape = arrays[needed[0]].shape
    if any(a.shape != shape for a in arrays.values()):
        raise ValueError(f"metrics: expected arrays of one shape, got { {m: a.shape for m, a in arrays.items()} }")
    return arrays


def decoder_roles(metrics: Mapping[str, np.ndarray], thresholds: RoleThresholds | None = None) -> np.ndarray:
    """Label every head of a decoder with one role (rules in the module docstring).

    Args:
        metrics: arrays of one shape (e.g. ``(NL, H)``) for ``induction_probe``, ``duplicate_probe``,
            ``prev``, ``first`` and ``entropy_ratio_causal``; NaN counts as below every threshold.
        thresholds: the rule thresholds (default :class:`RoleThresholds`).
    Returns:
        An array of role strings (from :data:`ROLES`) of the metrics' shape.
    Raises:
        ValueError: a missing metric, or metrics of different shapes.
    """
    t = thresholds or RoleThresholds()
    sink_label, sink_metric, sink_field = DECODER_SINK_ROLE
    needed = [m for _, m, _ in DECODER_PATTERN_ROLES] + [sink_metric, "entropy_ratio_causal"]
    arrays = _arrays(metrics, needed)
    shape = arrays["entropy_ratio_causal"].shape
    scores = np.stack([arrays[m] for _, m, _ in DECODER_PATTERN_ROLES])  # (3, …)
    limits = np.array([getattr(t, f) for _, _, f in DECODER_PATTERN_ROLES]).reshape((-1,) + (1,) * len(shape))
    qualifies = scores >= limits
    best = np.argmax(np.where(qualifies, scores, -np.inf), axis=0)  # first maximum on ties
    pattern_label = np.array([r for r, _, _ in DECODER_PATTERN_ROLES], dtype=object)[best]
    out = np.where(arrays["entropy_ratio_causal"] >= t.broad, "broad", "other").astype(object)
    out = np.where(arrays[sink_metric] >= getattr(t, sink_field), sink_label, out)
    out = np.where(qualifies.any(axis=0), pattern_label, out)
    return out.astype(str)
