"""A decoder's heads over texts (or token ids): the shared metrics, the detectors, and the probe.

Shape legend: NL layers, H heads per layer, N = NL · H, B batch, L padded length.

:class:`DecoderStats` streams batches of attention maps with their token ids and keeps, per head, the
metrics that mean the same in encoders and decoders (self, prev, entropy, distance, Voita's confidence
and positional test, Jensen–Shannon distances — through :class:`~headwise.analysis.HeadStats`, so the
same code computes the same quantity under the same name) plus the detectors of
:mod:`headwise.analysis.detectors` on the text (``first``, ``duplicate``, ``induction``). The probe of
repeated random tokens adds ``*_probe`` columns. Per sentence, then averaged over sentences, each
counting once (Clark et al.'s convention, as the encoder metrics). Roles:
:func:`headwise.analysis.roles.decoder_roles`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from headwise.analysis.block import RowBlock
from headwise.analysis.confidence import VOITA_POSITIONAL_THRESHOLD
from headwise.analysis.corpus import METRICS, HeadReport, HeadStats, check_state
from headwise.analysis.detectors import DETECTORS, Probe, detector_scores
from headwise.analysis.entropy import causal_entropy_ratio_rows
from headwise.analysis.roles import RoleThresholds, decoder_roles
from headwise.analysis.tokens import TokenInfo, as_attention, mean_over_rows

__all__ = ["DECODER_METRICS", "DecoderReport", "DecoderStats", "DetectorStats", "causal_entropy_ratio"]

_SHARED = ("self", "prev", "entropy", "uniform_entropy", "entropy_ratio", "distance", "confidence")
_SHARED_TAIL = ("positional_share", "positional_offset")
#: Every per-head metric of a :class:`DecoderReport`, with a one-line meaning.
DECODER_METRICS = (
    {"prev": METRICS["prev"]}
    | {k: f"{DETECTORS[k]} (text)" for k in ("first", "duplicate", "induction")}
    | {f"{k}_probe": f"{v} (probe of repeated random tokens)" for k, v in DETECTORS.items()}
    | {k: METRICS[k] for k in _SHARED if k != "prev"}
    | {
        "entropy_ratio_causal": "mean over queries of row entropy / ln(keys it may see), plain entropy "
        "(1 = uniform over the visible prefix)"
    }
    | {k: METRICS[k] for k in _SHARED_TAIL}
)


def causal_entropy_ratio(attn, info: TokenInfo | None = None) -> np.ndarray:
    """Mean over queries of ``H_i / ln m_i``, m_i the real keys at or before query i (queries with m_i ≥ 2).

    The entropy ratio of a causal head: uniform attention over the prefix a query may see scores 1,
    whereas ``entropy / ln n`` (:func:`headwise.analysis.entropy_ratio`) stays well under 1 for it
    (about 1 − 1/ln n). Plain entropy (no smoothing: smoothing would put mass on keys a causal query
    cannot see).

    Args:
        attn: ``(B, H, L, L)`` causal weights. info: token info (None: every position real).
    Returns:
        ``(B, H)``; NaN for a sentence of one token.
    """
    import torch

    a, info, _ = as_attention(attn, info)
    seen = torch.as_tensor(np.cumsum(np.asarray(info.valid, dtype=np.int64), axis=-1))  # (B, L) real keys j ≤ i
    ratio, rows = causal_entropy_ratio_rows(RowBlock.full(a, info), seen)  # (B, H, L), (B, L)
    return mean_over_rows(ratio.numpy(), rows.numpy())


class DetectorStats:
    """Running per-head sums of the detector scores (:data:`DETECTORS`) and the causal entropy ratio.

    Args:
        num_layers, num_heads: NL and H.
    """

    def __init__(self, num_layers: int, num_heads: int):
        self.num_layers, self.num_heads = num_layers, num_heads
        n = num_layers * num_heads
        self._names = tuple(DETECTORS) + ("entropy_ratio_causal",)
        self._sum = {k: np.zeros(n) for k in self._names}
        self._count = {k: np.zeros(n, dtype=np.int64) for k in self._names}

    def update(self, attentions: Sequence, ids, info: TokenInfo) -> None:
        """Add a batch: NL arrays ``(B, H, L, L)``, ids ``(B, L)``, masks ``(B, L)``."""
        if len(attentions) != self.num_layers:
            raise ValueError(f"attentions: expected {self.num_layers} layers, got {len(attentions)}")
        ids = np.asarray(ids)
        per_layer = []  # NL × {name: (B, H)}
        for a in attentions:
            scores = detector_scores(np.asarray(a), ids, info)
            scores["entropy_ratio_causal"] = causal_entropy_ratio(a, info)
            per_layer.append(scores)
        self.add_scores({name: np.concatenate([s[name] for s in per_layer], axis=1) for name in self._names})

    def add_scores(self, scores: Mapping[str, np.ndarray]) -> None:
        """Add sentences already scored: name → ``(B, N)`` (NaN: no target in that sentence)."""
        for name in self._names:
            v = np.asarray(scores[name], dtype=np.float64)
            ok = ~np.isnan(v)
            self._sum[name] += np.where(ok, v, 0.0).sum(axis=0)
            self._count[name] += ok.sum(axis=0)

    def state(self) -> dict:
        """The running sums as float64 tensors: ``sum.<name>``, ``count.<name>`` ``(N,)`` (see
        :meth:`HeadStats.state <headwise.analysis.HeadStats.state>`)."""
        import torch

        out = {f"sum.{k}": torch.as_tensor(self._sum[k], dtype=torch.float64).clone() for k in self._names}
        return out | {f"count.{k}": torch.as_tensor(self._count[k], dtype=torch.float64) for k in self._names}

    def add_state(self, state) -> None:
        """Add partial sums (another accumulator's :meth:`state`). Raises ValueError on other keys or shapes."""
        check_state("state", self.state(), state)
        for k in self._names:
            self._sum[k] += np.asarray(state[f"sum.{k}"], dtype=np.float64)
            self._count[k] += np.rint(np.asarray(state[f"count.{k}"], dtype=np.float64)).astype(np.int64)

    def result(self) -> dict[str, np.ndarray]:
        """name → ``(NL, H)`` mean over the sentences that had a target (NaN where none had)."""
        out = {}
        with np.errstate(invalid="ignore", divide="ignore"):
            for name in self._names:
                c = self._count[name]
                mean = np.where(c > 0, self._sum[name] / np.maximum(c, 1), np.nan)
                out[name] = mean.reshape(self.num_layers, self.num_heads)
        return out


@dataclass
class DecoderReport(HeadReport):
    """A :class:`~headwise.analysis.HeadReport` whose metrics are :data:`DECODER_METRICS`.

    Attributes (besides the report's):
        probe: the probe's settings (:meth:`Probe.to_dict`), or None when none was run.
    """

    metric_names: ClassVar[tuple[str, ...]] = tuple(DECODER_METRICS)

    probe: dict | None = None

    def to_dict(self) -> dict:
        data = super().to_dict()
        t = self.thresholds
        data["kind"] = "decoder"
        data["metrics"] = DECODER_METRICS
        data["role_thresholds"] = {
            "induction": t.induction,
            "duplicate": t.duplicate,
            "position": t.position,
            "sink": t.sink,
            "broad": t.broad,
            "positional_share": VOITA_POSITIONAL_THRESHOLD,
        }
        data["probe"] = self.probe
        return data


class DecoderStats:
    """Every decoder metric of every head, streamed over batches (constant memory).

    Args:
        num_layers, num_heads: NL and H.
        max_length: the longest sequence accepted.
        js: also the Jensen–Shannon distances between heads.
        thresholds: role thresholds.
    """

    def __init__(
        self,
        num_layers: int,
        num_heads: int,
        *,
        max_length: int = 512,
        js: bool = True,
        thresholds: RoleThresholds | None = None,
    ):
        self.heads = HeadStats(num_layers, num_heads, max_length=max_length, js=js, thresholds=thresholds)
        self.detectors = DetectorStats(num_layers, num_heads)

    @property
    def num_sentences(self) -> int:
        return self.heads.num_sentences

    @property
    def num_tokens(self) -> int:
        return self.heads.num_tokens

    def state(self) -> dict:
        """Both accumulators' sums as float64 tensors, ``heads.<key>`` and ``detectors.<key>``."""
        return {f"heads.{k}": v for k, v in self.heads.state().items()} | {
            f"detectors.{k}": v for k, v in self.detectors.state().items()
        }

    def add_state(self, state) -> None:
        """Add partial sums (another :class:`DecoderStats`' :meth:`state`). Raises ValueError on other keys."""
        check_state("state", self.state(), state)
        for prefix, acc in (("heads.", self.heads), ("detectors.", self.detectors)):
            acc.add_state({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})

    def update(self, attentions: Sequence, ids, info: TokenInfo) -> None:
        """Add a batch: NL arrays ``(B, H, L, L)``, token ids ``(B, L)`` and the batch's token info."""
        self.heads.update(attentions, info)
        self.detectors.update(attentions, ids, info)

    def result(self, probe_scores: Mapping[str, np.ndarray] | None = None, probe: Probe | None = None) -> DecoderReport:
        """The :class:`DecoderReport`.

        Args:
            probe_scores: the probe's :meth:`DetectorStats.result` (name → ``(NL, H)``); None: NaN columns.
            probe: the probe's settings, recorded in the report.
        Raises:
            ValueError: no sentence was added.
        """
        base = self.heads.result()
        text = self.detectors.result()
        shape = base.roles.shape
        metrics = {}
        for name in DECODER_METRICS:
            if name in base.metrics:
                metrics[name] = base.metrics[name]
            elif name.endswith("_probe"):
                key = name[: -len("_probe")]
                metrics[name] = np.full(shape, np.nan) if probe_scores is None else np.asarray(probe_scores[key])
            else:
                metrics[name] = text[name]
        return DecoderReport(
            metrics=metrics,
            positional=base.positional,
            roles=decoder_roles(metrics, base.thresholds),
            js_divergence=base.js_divergence,
            js_distance=base.js_distance,
            mds=base.mds,
            num_sentences=base.num_sentences,
            num_tokens=base.num_tokens,
            thresholds=base.thresholds,
            probe=None if probe is None else probe.to_dict(),
        )
