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

Roles are empirical summaries of one model on one corpus, not mechanisms: a head labelled
"previous-token" on this corpus may do something else elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np

from headwise import checks

__all__ = ["RoleThresholds", "SHARE_ROLES", "ROLES", "head_roles"]

#: (role label, metric name, threshold field) in tie-breaking order.
SHARE_ROLES = (
    ("previous-token", "prev", "position"),
    ("next-token", "next", "position"),
    ("self", "self", "position"),
    ("[CLS] sink", "cls", "sink"),
    ("[SEP] sink", "sep", "sink"),
    ("punctuation sink", "punct", "sink"),
)
#: Every label :func:`head_roles` can give.
ROLES = tuple(r for r, _, _ in SHARE_ROLES) + ("broad", "other")


@dataclass(frozen=True)
class RoleThresholds:
    """Thresholds of the role rules.

    Attributes:
        position: minimum share of attention to the previous / next token or to itself.
        sink: minimum share of attention to [CLS], [SEP] or punctuation.
        broad: minimum entropy ratio (entropy / ln n) of a broad head.
    """

    position: float = 0.5
    sink: float = 0.5
    broad: float = 0.8

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
    missing = [m for m in needed if m not in metrics]
    if missing:
        raise ValueError(f"metrics: expected the keys {needed}, missing {missing}")
    arrays = {m: np.nan_to_num(np.asarray(metrics[m], dtype=np.float64), nan=-np.inf) for m in needed}
    shape = arrays["prev"].shape
    if any(a.shape != shape for a in arrays.values()):
        raise ValueError(f"metrics: expected arrays of one shape, got { {m: a.shape for m, a in arrays.items()} }")
    scores = np.stack([arrays[m] for _, m, _ in SHARE_ROLES])  # (6, …)
    limits = np.array([getattr(t, f) for _, _, f in SHARE_ROLES]).reshape((-1,) + (1,) * len(shape))
    qualifies = scores >= limits
    best = np.argmax(np.where(qualifies, scores, -np.inf), axis=0)  # first maximum on ties
    share_label = np.array([r for r, _, _ in SHARE_ROLES], dtype=object)[best]
    out = np.where(arrays["entropy_ratio"] >= t.broad, "broad", "other").astype(object)
    out = np.where(qualifies.any(axis=0), share_label, out)
    return out.astype(str)
