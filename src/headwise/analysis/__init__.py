"""Per-head attention statistics (Clark et al. 2019; Voita et al. 2019) as NumPy functions, and head
importance (Michel et al. 2019) on a model it is handed — metrics only: it opens no model folder and
imports neither :mod:`headwise.models`, :mod:`headwise.hf`, :mod:`headwise.lab` nor the command line.

Shape legend: B batch, H heads, L sequence length; NL layers, N = NL · H heads of a whole model.

Every metric takes attention weights ``(B, H, L, L)`` (or one sentence's ``(H, L, L)``) and a
:class:`TokenInfo` saying which positions are real tokens, [CLS], [SEP] or punctuation. Padded
positions are excluded from every metric. One concept per module:

- :mod:`~headwise.analysis.tokens` — :class:`TokenInfo`, :func:`token_info`.
- :mod:`~headwise.analysis.block` — :class:`RowBlock`: a block of attention rows and their positions, the one
  input of every metric's reducer (each metric's per-row maths, written once in its module and called by the
  full maps and by the streaming pass, :mod:`~headwise.analysis.streaming`).
- :mod:`~headwise.analysis.targets` — attention to [CLS], [SEP], punctuation, self, previous, next.
- :mod:`~headwise.analysis.entropy` — row entropy with Clark et al.'s smoothing, [CLS]-row entropy, ln n.
- :mod:`~headwise.analysis.distance` — mean attention distance |i − j|.
- :mod:`~headwise.analysis.confidence` — Voita's confidence and positional-head test.
- :mod:`~headwise.analysis.divergence` — Jensen–Shannon divergence / distance between heads.
- :mod:`~headwise.analysis.mds` — classical MDS map of the heads.
- :mod:`~headwise.analysis.detectors` — decoder detectors (previous-token, first-token, duplicate-token,
  induction) and the probe of repeated random tokens.
- :mod:`~headwise.analysis.decoder` — a decoder's heads over texts and the probe (:class:`DecoderStats`).
- :mod:`~headwise.analysis.roles` — role labels with documented thresholds (encoders and decoders).
- :mod:`~headwise.analysis.evidence` — what each head does over a corpus, gathered in the statistics' streaming
  pass (:class:`HeadEvidence`: offset profile, first-token share, marks, top contexts; helpers in
  :mod:`~headwise.analysis.evidence_top`); :mod:`~headwise.analysis.atlas_roles` — every head's roles with that
  evidence (:func:`atlas_roles`, :class:`AtlasThresholds`, :data:`ATLAS_ROLES`).
- :mod:`~headwise.analysis.corpus` — streaming aggregation over a corpus (:class:`HeadStats`,
  :func:`analyze_texts`); :mod:`~headwise.analysis.corpus_file` — a text file's lines streamed (:class:`CorpusFile`).
- :mod:`~headwise.analysis.sentence` — one sentence's report and maps (:func:`analyze_sentence`).
- :mod:`~headwise.analysis.importance` — Michel et al.'s head importance, single-head ablation and pruning
  curves (:func:`head_importance`, with ``scored=`` for which tokens are scored), on any model shaped as
  :class:`headwise.models.HeadModel` (PyTorch, imported when called); :func:`ablation_objectives` measures any
  head sets. Its parts: :mod:`~headwise.analysis.objective` (what is scored), :mod:`~headwise.analysis.gates`
  (the gates' importance), :mod:`~headwise.analysis.sweep_plan` (the passes' rows), :mod:`~headwise.analysis.ablation`
  (measured ablation).
- :mod:`~headwise.analysis.batched` — the one engine of batched copies: jobs of heads (at every position or chosen
  ones; zero or mean ablation, another run's heads for patching) or of a caller's edits (circuits' paths) as copies
  of a batch in one forward, started at the lowest touched layer's ``resid_pre``.

The package draws nothing on the terminal: :func:`analyze_texts` reports progress to a callback.
The adapters that run a model and return its maps live with the models (:mod:`headwise.models.attend`).
"""

from headwise.analysis.atlas_roles import ATLAS_ROLES, AtlasRoles, AtlasThresholds, RoleEvidence, atlas_roles
from headwise.analysis.block import RowBlock
from headwise.analysis.confidence import (
    VOITA_POSITIONAL_THRESHOLD,
    argmax_offsets,
    confidence,
    positional_heads,
)
from headwise.analysis.corpus import METRICS, HeadReport, HeadStats, analyze_texts
from headwise.analysis.corpus_file import CorpusFile
from headwise.analysis.decoder import DECODER_METRICS, DecoderReport, DecoderStats, DetectorStats
from headwise.analysis.detectors import (
    DETECTORS,
    Probe,
    detector_scores,
    duplicate_token_pattern,
    first_token_pattern,
    induction_pattern,
    pattern_score,
    previous_token_pattern,
    repeated_random_tokens,
)
from headwise.analysis.distance import mean_attention_distance
from headwise.analysis.divergence import (
    CLARK_JS_SMOOTHING,
    js_distance_between_heads,
    js_divergence_between_heads,
)
from headwise.analysis.entropy import (
    CLARK_ENTROPY_SMOOTHING,
    attention_entropy,
    cls_entropy,
    entropy_ratio,
    row_entropy,
    uniform_entropy,
)
from headwise.analysis.evidence import Context, Evidence, HeadEvidence
from headwise.analysis.importance import (
    SCORED,
    ImportanceResult,
    ablation_objectives,
    gate_importance,
    head_importance,
)
from headwise.analysis.mds import classical_mds
from headwise.analysis.roles import ROLES, RoleThresholds, decoder_roles, head_roles
from headwise.analysis.sentence import SentenceHeads, analyze_sentence
from headwise.analysis.targets import (
    attention_to_cls,
    attention_to_mask,
    attention_to_next,
    attention_to_offset,
    attention_to_previous,
    attention_to_punctuation,
    attention_to_self,
    attention_to_sep,
)
from headwise.analysis.tokens import CLARK_PUNCTUATION, TokenInfo, as_token_info, token_info

__all__ = [
    "TokenInfo",
    "token_info",
    "as_token_info",
    "CLARK_PUNCTUATION",
    "RowBlock",
    "attention_to_mask",
    "attention_to_offset",
    "attention_to_cls",
    "attention_to_sep",
    "attention_to_punctuation",
    "attention_to_self",
    "attention_to_previous",
    "attention_to_next",
    "CLARK_ENTROPY_SMOOTHING",
    "row_entropy",
    "attention_entropy",
    "cls_entropy",
    "uniform_entropy",
    "entropy_ratio",
    "mean_attention_distance",
    "VOITA_POSITIONAL_THRESHOLD",
    "confidence",
    "argmax_offsets",
    "positional_heads",
    "CLARK_JS_SMOOTHING",
    "js_divergence_between_heads",
    "js_distance_between_heads",
    "classical_mds",
    "ROLES",
    "RoleThresholds",
    "head_roles",
    "decoder_roles",
    "HeadEvidence",
    "Evidence",
    "Context",
    "atlas_roles",
    "AtlasRoles",
    "AtlasThresholds",
    "RoleEvidence",
    "ATLAS_ROLES",
    "DETECTORS",
    "previous_token_pattern",
    "first_token_pattern",
    "duplicate_token_pattern",
    "induction_pattern",
    "pattern_score",
    "detector_scores",
    "Probe",
    "repeated_random_tokens",
    "DECODER_METRICS",
    "DecoderReport",
    "DecoderStats",
    "DetectorStats",
    "METRICS",
    "HeadReport",
    "HeadStats",
    "analyze_texts",
    "CorpusFile",
    "SentenceHeads",
    "analyze_sentence",
    "SCORED",
    "ImportanceResult",
    "gate_importance",
    "head_importance",
    "ablation_objectives",
]
