"""Every head's roles with their evidence, for the atlas: the pattern roles of :mod:`headwise.analysis.roles` and the
named patterns that a corpus's :class:`~headwise.analysis.evidence.Evidence` shows.

Shape legend: NL layers, H heads per layer.

The rules, in tiers (thresholds :class:`AtlasThresholds`, defaults in brackets). A head gets every role whose score
reaches its threshold, as a :class:`RoleEvidence`; its list runs tier by tier, strongest first within a tier, and
its first entry is its primary role — "other" when the list is empty.

1. **Pattern roles** (as :func:`~headwise.analysis.roles.decoder_roles`; a role whose metric the report lacks —
   an encoder's report has no probe — is skipped): *induction* (``induction_probe`` ≥ ``induction`` [0.4]),
   *duplicate-token* (``duplicate_probe`` ≥ ``duplicate`` [0.4]), *previous-token* (``prev`` ≥ ``position``
   [0.5]).
2. **Named patterns** from the evidence: *self* (the share at offset 0 ≥ ``position`` [0.5]); *positional* (the
   largest share at one offset d other than 0 and 1 — d = 1 is previous-token — ≥ ``positional`` [0.5], detail
   "offset d"); *same-token* (the share on earlier or later copies of the query's token ≥ ``same_token`` [0.4]);
   *delimiter* (the largest share on one of the delimiter marks — punctuation, newlines — ≥ ``delimiter``
   [0.5]); *line-start* (the share on the first token of the query's line ≥ ``line_start`` [0.4]).
3. **First-token sink**: the share on the first real token ≥ ``sink`` [0.5] (after the patterns: many pattern
   heads park their spare attention on it).
4. **Copying**: the OV circuit's copying score (computed elsewhere, from the weights) ≥ ``copying`` [0.5] — a
   property of what the head writes, not where it looks, so it accompanies any attention role; primary only where
   no attention pattern fits (on SmolLM2 nearly half the heads' OV circuits score above 0.5, most of them sinks:
   where a head looks is named first).
5. **Broad**: the entropy ratio (decoders ``entropy_ratio_causal``, encoders ``entropy_ratio``) ≥ ``broad`` [0.8].

Why these numbers: "more than half its attention" is Clark et al. 2019's mark of a positional or sink head, and
0.5 serves every share of one target here (offset, delimiter, sink); the probe's 0.4 is more than ten times what a
head spreading its attention puts on one target (see :mod:`headwise.analysis.roles`); same-token and line-start
targets are usually several keys or one key far back, and a head that spreads its attention over the prefix puts a
small share on them (a text's repetition rate, about 1 / line length), so 0.4 is far above chance while admitting
heads that split their attention with the sink; copying scores lie in [−1, 1] and 0.5 asks that most of the OV
circuit's eigenvalue mass be positive (Elhage et al. 2021).

Roles are empirical summaries of one model on one corpus, not mechanisms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from headwise import checks
from headwise.analysis.evidence import LINE_START, SAME_TOKEN, Evidence
from headwise.analysis.roles import RoleThresholds

__all__ = ["ATLAS_ROLES", "AtlasRoles", "AtlasThresholds", "RoleEvidence", "atlas_roles"]

#: Every role the atlas can name, with a one-line description, in display order (the page's legend).
ATLAS_ROLES = (
    ("induction", "attends to the token after an earlier copy of the current token (probe of repeated tokens)"),
    ("duplicate-token", "attends to earlier copies of the current token (probe of repeated tokens)"),
    ("previous-token", "attends to the token just before"),
    ("self", "attends to the current token itself"),
    ("positional", "attends to the token at one fixed offset back (or ahead)"),
    ("same-token", "attends to other occurrences of the current token in the text"),
    ("delimiter", "attends to punctuation or line breaks"),
    ("line-start", "attends to the first token of the current line"),
    ("copying", "its output raises the logits of the tokens it attends to (OV circuit)"),
    ("first-token sink", "parks its attention on the first token"),
    ("broad", "spreads its attention evenly over what it can see"),
    ("other", "no rule fits; see its evidence"),
)
#: The :class:`AtlasThresholds` field of each role's threshold.
ROLE_FIELDS = {
    "induction": "induction", "duplicate-token": "duplicate", "previous-token": "position", "self": "position",
    "positional": "positional", "same-token": "same_token", "delimiter": "delimiter", "line-start": "line_start",
    "copying": "copying", "first-token sink": "sink", "broad": "broad",
}  # fmt: skip
_TIERS = {
    "induction": 0, "duplicate-token": 0, "previous-token": 0,
    "self": 1, "positional": 1, "same-token": 1, "delimiter": 1, "line-start": 1,
    "first-token sink": 2, "copying": 3, "broad": 4,
}  # fmt: skip
_PROBE = "probe of repeated random tokens"


@dataclass(frozen=True)
class AtlasThresholds(RoleThresholds):
    """Thresholds of the atlas's role rules (reasons in the module docstring): those of
    :class:`~headwise.analysis.roles.RoleThresholds`, with their defaults — ``induction``, ``duplicate`` (the
    probe's scores), ``position`` (the share on the previous token, here also on the query itself), ``sink`` (here
    the share on the first real token), ``broad`` (the entropy ratio) — and the evidence's.

    Attributes:
        positional: the share at one fixed offset other than 0 and 1.
        same_token: the share on other occurrences of the query's token.
        delimiter: the share on one kind of delimiter (a mark the caller names).
        line_start: the share on the first token of the query's line.
        copying: the OV copying score.
    Raises:
        ValueError: a threshold outside (0, 1], naming the field and the value (the check of
            :class:`~headwise.analysis.roles.RoleThresholds`).
    """

    positional: float = 0.5
    same_token: float = 0.4
    delimiter: float = 0.5
    line_start: float = 0.4
    copying: float = 0.5

    def for_role(self, name: str) -> float | None:
        """The threshold of the role ``name`` (:data:`ATLAS_ROLES`; None for "other"). Raises ValueError on a name
        that is not a role."""
        if name == "other":
            return None
        checks.one_of("name", name, tuple(ROLE_FIELDS))
        return getattr(self, ROLE_FIELDS[name])


@dataclass(frozen=True)
class RoleEvidence:
    """One role a head passes: its ``name`` (:data:`ATLAS_ROLES`), ``score``, the ``threshold`` it passed and a
    short ``detail`` (what was measured: "offset 3", "probe of repeated random tokens", …)."""

    name: str
    score: float
    threshold: float
    detail: str


@dataclass(frozen=True)
class AtlasRoles:
    """Every head's roles: ``roles[layer][head]`` its :class:`RoleEvidence` list (tier by tier, strongest first
    within a tier; empty when nothing fits) and ``primary`` ``(NL, H)`` its first entry's name, or "other"."""

    roles: list[list[list[RoleEvidence]]]
    primary: np.ndarray


def atlas_roles(
    report,
    evidence: Evidence,
    *,
    copying: np.ndarray | None = None,
    delimiters: Sequence[str] | None = None,
    thresholds: AtlasThresholds | None = None,
) -> AtlasRoles:
    """Every head's roles with their evidence (rules in the module docstring).

    Args:
        report: a :class:`~headwise.analysis.DecoderReport` / :class:`~headwise.analysis.HeadReport` (its
            ``metrics``) or the metrics themselves, name → ``(NL, H)`` (NaN: below every threshold).
        evidence: the corpus's :class:`~headwise.analysis.evidence.Evidence` (same NL, H).
        copying: ``(NL, H)`` OV copying scores, or None (no copying role).
        delimiters: the evidence's marks that count as delimiters (default: every mark but the built-in
            same-token and line-start).
        thresholds: the rule thresholds (default :class:`AtlasThresholds`).
    Raises:
        ValueError: naming the argument: arrays of another shape than the evidence's ``(NL, H)``, a delimiter mark
            the evidence lacks.
    """
    t = thresholds or AtlasThresholds()
    metrics = getattr(report, "metrics", report)
    shape = evidence.first.shape
    if delimiters is None:
        delimiters = [m for m in evidence.marks if m not in (SAME_TOKEN, LINE_START)]
    missing = [m for m in delimiters if m not in evidence.marks]
    if missing:
        raise ValueError(f"delimiters: the evidence has no marks {missing}; it has {sorted(evidence.marks)}")
    found: list[tuple[str, np.ndarray, object]] = []  # (role, scores (NL, H), its detail or (NL, H) details)

    def shaped(name: str, a) -> np.ndarray:
        a = np.asarray(a, dtype=np.float64)
        if a.shape != shape:
            raise ValueError(f"{name}: expected shape (NL, H) = {shape}, got {a.shape}")
        return np.nan_to_num(a, nan=-np.inf)

    for role, metric, detail in (
        ("induction", "induction_probe", _PROBE),
        ("duplicate-token", "duplicate_probe", _PROBE),
        ("previous-token", "prev", "share on the previous token"),
    ):
        if metric in metrics:
            found.append((role, shaped(f"report.metrics['{metric}']", metrics[metric]), detail))
    found.append(("self", shaped("evidence.offsets", evidence.at_offset(0)), "offset 0"))
    d = np.arange(evidence.start, evidence.start + evidence.offsets.shape[-1])
    others = np.where((d == 0) | (d == 1), -np.inf, np.nan_to_num(evidence.offsets, nan=-np.inf))  # (NL, H, K')
    best = others.argmax(-1)
    found.append(("positional", others.max(-1), np.vectorize(lambda i: f"offset {d[i]}")(best)))
    same = "share on other occurrences of the query's token"
    found.append((SAME_TOKEN, shaped("evidence.marks", evidence.marks[SAME_TOKEN]), same))
    if delimiters:
        shares = np.stack([shaped("evidence.marks", evidence.marks[m]) for m in delimiters], -1)  # (NL, H, M)
        which = np.asarray(delimiters, dtype=object)[shares.argmax(-1)]
        details = np.vectorize(lambda m: f"share on {m} tokens", otypes=[object])(which)
        found.append(("delimiter", shares.max(-1), details))
    if LINE_START in evidence.marks:
        line = "share on the first token of the query's line"
        found.append((LINE_START, shaped("evidence.marks", evidence.marks[LINE_START]), line))
    if copying is not None:
        found.append(("copying", shaped("copying", copying), "OV copying score"))
    found.append(("first-token sink", shaped("evidence.first", evidence.first), "share on the first token"))
    ratio = "entropy_ratio_causal" if "entropy_ratio_causal" in metrics else "entropy_ratio"
    if ratio in metrics:
        detail = "entropy over ln(keys seen)" if ratio == "entropy_ratio_causal" else "entropy over ln(tokens)"
        found.append(("broad", shaped(f"report.metrics['{ratio}']", metrics[ratio]), detail))
    return _assemble(found, shape, t)


def _assemble(found, shape, t: AtlasThresholds) -> AtlasRoles:
    NL, H = shape
    roles = [[[] for _ in range(H)] for _ in range(NL)]
    for name, scores, detail in found:
        threshold = t.for_role(name)
        for layer, head in zip(*np.nonzero(scores >= threshold)):
            text = detail if isinstance(detail, str) else str(detail[layer, head])
            roles[layer][head].append(RoleEvidence(name, float(scores[layer, head]), float(threshold), text))
    primary = np.full(shape, "other", dtype=object)
    for layer in range(NL):
        for head in range(H):
            kept = sorted(roles[layer][head], key=lambda r: (_TIERS[r.name], -r.score))  # stable: rule order on ties
            roles[layer][head] = kept
            if kept:
                primary[layer, head] = kept[0].name
    return AtlasRoles(roles, primary.astype(str))
