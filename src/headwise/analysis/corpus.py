"""Corpus mode: every per-head metric of a model, aggregated over many sentences in constant memory.

Shape legend: NL layers, H heads per layer, N = NL · H heads of the whole model, B batch, L length.

:class:`HeadStats` takes batches of attention maps (one ``(B, H, L, L)`` array per layer) with their
:class:`TokenInfo` and keeps only running sums: per-head sums and counts of each sentence-level metric
(Clark et al.'s metrics average sentences, each counting once), token-level sums for Voita's confidence,
a histogram of argmax offsets per head (bounded by ``max_length``) and the ``(N, N)`` Jensen–Shannon
sums. Memory does not grow with the corpus. :func:`analyze_texts` drives a model over an iterable of
texts in batches, reporting progress to a callback; :class:`CorpusFile`
(:mod:`headwise.analysis.corpus_file`) streams a text file line by line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from headwise import checks
from headwise.analysis.block import RowBlock
from headwise.analysis.confidence import (
    VOITA_POSITIONAL_THRESHOLD,
    count_offsets,
    positional_from_histogram,
    row_max_offsets,
)
from headwise.analysis.corpus_file import CorpusFile
from headwise.analysis.distance import distance_rows
from headwise.analysis.divergence import CLARK_JS_SMOOTHING, sentence_js_sums
from headwise.analysis.entropy import CLARK_ENTROPY_SMOOTHING, at_cls, entropy_rows, over_uniform
from headwise.analysis.mds import classical_mds
from headwise.analysis.roles import RoleThresholds, head_roles
from headwise.analysis.targets import mass_at, mass_on, offset_keys
from headwise.analysis.tokens import TokenInfo, as_attention, as_token_info, mean_over_rows

__all__ = ["METRICS", "HeadReport", "HeadStats", "analyze_texts", "check_state", "CorpusFile"]

#: Every per-head metric of a :class:`HeadReport`, with a one-line meaning (used by tables and docs).
METRICS = {
    "cls": "mean attention to [CLS]",
    "sep": "mean attention to [SEP]",
    "punct": "mean attention to punctuation (. and ,)",
    "self": "mean attention of a token to itself",
    "prev": "mean attention to the previous token",
    "next": "mean attention to the next token",
    "entropy": "mean row entropy, nats (Clark et al.'s smoothing)",
    "entropy_cls": "entropy of the [CLS] row, nats",
    "uniform_entropy": "ln n: entropy of uniform attention, nats",
    "entropy_ratio": "entropy / ln n (1 = uniform)",
    "distance": "mean attention distance |i - j|, tokens",
    "confidence": "Voita's confidence: mean of each row's maximum",
    "positional_share": "share of tokens whose argmax is at the head's most common offset",
    "positional_offset": "the head's most common argmax offset (j - i)",
}
_SENTENCE_METRICS = (
    "cls",
    "sep",
    "punct",
    "self",
    "prev",
    "next",
    "entropy",
    "entropy_cls",
    "entropy_ratio",
    "distance",
)


@dataclass
class HeadReport:
    """Every metric of every head of a model over a corpus.

    Attributes:
        metrics: name (see :data:`METRICS`) → ``(NL, H)`` array.
        positional: ``(NL, H)`` bool, Voita's test (share ≥ 0.9).
        roles: ``(NL, H)`` role labels (:func:`headwise.analysis.roles.head_roles`).
        js_divergence: ``(N, N)`` mean per-token JS divergence (nats) between heads, N = NL · H
            (head n is layer ``n // H``, head ``n % H``), or None when not computed.
        js_distance: ``(N, N)`` its square root, or None.
        mds: ``(N, 2)`` classical-MDS map of the heads from ``js_distance``, or None.
        num_sentences, num_tokens: what was aggregated (real tokens, special ones included).
        thresholds: the role thresholds used.
    """

    # The metric columns this kind of report carries, in order (a subclass names its own).
    metric_names: ClassVar[tuple[str, ...]] = tuple(METRICS)

    metrics: dict[str, np.ndarray]
    positional: np.ndarray
    roles: np.ndarray
    js_divergence: np.ndarray | None
    js_distance: np.ndarray | None
    mds: np.ndarray | None
    num_sentences: int
    num_tokens: int
    thresholds: RoleThresholds = field(default_factory=RoleThresholds)

    @property
    def num_layers(self) -> int:
        return self.roles.shape[0]

    @property
    def num_heads(self) -> int:
        return self.roles.shape[1]

    def rows(self) -> list[dict]:
        """One dict per head (layer-major), with ``layer``, ``head``, every metric, ``positional``, ``role``
        and, when computed, the MDS coordinates ``mds_x`` / ``mds_y``."""
        out = []
        for layer in range(self.num_layers):
            for head in range(self.num_heads):
                row: dict = {"layer": layer, "head": head}
                for name in self.metric_names:
                    v = self.metrics[name][layer, head]
                    row[name] = int(v) if name == "positional_offset" else json_number(v)
                row["positional"] = bool(self.positional[layer, head])
                row["role"] = str(self.roles[layer, head])
                if self.mds is not None:
                    n = layer * self.num_heads + head
                    row["mds_x"], row["mds_y"] = json_number(self.mds[n, 0]), json_number(self.mds[n, 1])
                out.append(row)
        return out

    def to_dict(self) -> dict:
        """A JSON-ready dict: sizes, metric meanings, thresholds, per-head rows and the head distances."""
        return {
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "num_sentences": self.num_sentences,
            "num_tokens": self.num_tokens,
            "metrics": METRICS,
            "role_thresholds": {
                "position": self.thresholds.position,
                "sink": self.thresholds.sink,
                "broad": self.thresholds.broad,
                "positional_share": VOITA_POSITIONAL_THRESHOLD,
            },
            "heads": self.rows(),
            "js_divergence": None if self.js_divergence is None else _nested(self.js_divergence),
            "js_distance": None if self.js_distance is None else _nested(self.js_distance),
        }


def json_number(v) -> float | None:
    """``float(v)``, or None for NaN (JSON has no NaN)."""
    v = float(v)
    return None if math.isnan(v) else v


def _nested(a: np.ndarray) -> list:
    return [[round(float(x), 8) for x in row] for row in a]


#: Rows × keys of one sentence's Jensen–Shannon sample beyond 1,024 tokens (the cost of 128 rows at 1,024).
JS_CELLS = 1 << 17


def js_row_budget(n: int, max_rows: int = 128) -> int:
    """Rows sampled per sentence for the Jensen–Shannon sums: ``max_rows`` (128) up to 1,024 tokens, then
    ``JS_CELLS // n`` (16 at 8,192 tokens), never fewer than 8 — the pairwise cost stays that of 1,024 tokens."""
    return max(min(8, max_rows), min(max_rows, JS_CELLS // max(n, 1)))


def js_sample_rows(n: int, max_rows: int) -> np.ndarray:
    """The query rows (of n) the Jensen–Shannon sums of one sentence use: all n, or ``max_rows`` evenly spaced."""
    if n <= max_rows:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, max_rows).round().astype(np.int64))


class HeadStats:
    """Running per-head statistics over sentences (constant memory).

    Args:
        num_layers, num_heads: NL and H of the model.
        max_length: the longest sentence accepted (sizes the offset histogram; BERT: 512).
        js: also accumulate the Jensen–Shannon sums between heads (the costliest part: N² · n² per sentence).
        js_max_rows: in sentences longer than this, the JS divergence is averaged over this many evenly
            spaced query rows instead of all n (an estimate of the same per-token mean, at N² · rows · n cost);
            beyond 1,024 tokens over fewer (:func:`js_row_budget`: 16 at 8,192), so the cost stays bounded.
        thresholds: role thresholds for :meth:`result`.
        entropy_smoothing, js_smoothing: Clark et al.'s ε values (10⁻⁴ and 10⁻³).
    """

    def __init__(
        self,
        num_layers: int,
        num_heads: int,
        *,
        max_length: int = 512,
        js: bool = True,
        thresholds: RoleThresholds | None = None,
        entropy_smoothing: float = CLARK_ENTROPY_SMOOTHING,
        js_smoothing: float = CLARK_JS_SMOOTHING,
        js_max_rows: int = 128,
    ):
        sizes = {"num_layers": num_layers, "num_heads": num_heads, "max_length": max_length, "js_max_rows": js_max_rows}
        for name, v in sizes.items():
            checks.positive_int(name, v)
        self.num_layers, self.num_heads, self.max_length = num_layers, num_heads, max_length
        self.js = js
        self.thresholds = thresholds or RoleThresholds()
        self.entropy_smoothing, self.js_smoothing = entropy_smoothing, js_smoothing
        n = num_layers * num_heads
        self._sum = {m: np.zeros(n) for m in _SENTENCE_METRICS}
        self._count = {m: np.zeros(n, dtype=np.int64) for m in _SENTENCE_METRICS}
        self._uniform_sum = 0.0
        self._conf_sum = np.zeros(n)
        self._conf_count = 0
        # (N, 2·span − 1): offsets −(span − 1) … span − 1, grown to the longest offset counted so far (a 8,192-token
        # model's full width, 2·max_length − 1 columns per head, is 35 MB for SmolLM2's 270 heads)
        self._hist = np.zeros((n, 1), dtype=np.int64)
        self._js_sum = np.zeros((n, n)) if js else None
        self._js_rows = 0
        self.js_max_rows = js_max_rows
        self.num_sentences = 0
        self.num_tokens = 0

    def update(self, attentions: Sequence, info) -> None:
        """Add a batch.

        Args:
            attentions: NL arrays (or CPU tensors) ``(B, H, L, L)``, one per layer.
            info: the batch's token info, masks ``(B, L)``: a :class:`TokenInfo` or a tokenizer's batch
                (see :func:`~headwise.analysis.tokens.as_token_info`).
        Raises:
            ValueError: a number of layers or heads that differs from the accumulator's, shapes that do
            not fit ``info``, a sentence longer than ``max_length``.
        """
        if len(attentions) != self.num_layers:
            raise ValueError(f"attentions: expected {self.num_layers} layers, got {len(attentions)}")
        layers = [np.asarray(a) for a in attentions]
        info = as_token_info(info)
        valid = np.asarray(info.valid, dtype=bool)
        for k, a in enumerate(layers):
            if a.ndim != 4 or a.shape[1] != self.num_heads or a.shape[0] != valid.shape[0]:
                raise ValueError(
                    f"attentions[{k}]: expected shape ({valid.shape[0]}, {self.num_heads}, L, L), got {a.shape}"
                )
            if a.shape[2:] != (valid.shape[1], valid.shape[1]):
                raise ValueError(f"attentions[{k}]: expected L = {valid.shape[1]} to fit info, got {a.shape}")
        for b in range(valid.shape[0]):
            idx = np.flatnonzero(valid[b])
            if idx.size == 0:
                continue
            if idx.size > self.max_length:
                raise ValueError(f"attentions: a sentence of {idx.size} tokens exceeds max_length={self.max_length}")
            p = np.concatenate([a[b][:, idx][:, :, idx] for a in layers], axis=0)  # (N, n, n)
            sent = TokenInfo(
                valid=np.ones((1, idx.size), dtype=bool),
                cls=np.asarray(info.cls)[b : b + 1, idx],
                sep=np.asarray(info.sep)[b : b + 1, idx],
                punct=np.asarray(info.punct)[b : b + 1, idx],
            )
            self._add_sentence(p[None].astype(np.float64), sent)

    def _add_sentence(self, p: np.ndarray, info: TokenInfo) -> None:
        # p: (1, N, n, n), every position real: one block of the whole map, every metric's reducer on it (the
        # public metric functions' maths, checked and renormalised once)
        import torch

        a, info, _ = as_attention(p, info)
        block = RowBlock.full(a, info)
        valid = info.valid  # (1, n)
        marks = torch.as_tensor(np.stack([info.cls, info.sep, info.punct], -1).astype(np.float64))  # (1, n, 3)
        on = mass_on(block, marks).numpy()  # (1, N, n, 3)
        values = {name: mean_over_rows(on[..., k], valid) for k, name in enumerate(("cls", "sep", "punct"))}
        for name, offset in (("self", 0), ("prev", -1), ("next", 1)):
            key, has_target = offset_keys(valid, offset)
            values[name] = mean_over_rows(mass_at(block, torch.as_tensor(key)).numpy(), valid & has_target)
        h = entropy_rows(block, checks.number_in("smoothing", self.entropy_smoothing, 0, 1)).numpy()  # (1, N, n)
        values["entropy"] = mean_over_rows(h, valid)
        values["entropy_cls"] = at_cls(h, info)
        values["entropy_ratio"] = over_uniform(values["entropy"], info)
        values["distance"] = mean_over_rows(distance_rows(block).numpy(), valid)
        n = p.shape[-1]
        rows = info.valid[0] & ~info.special[0]  # (n,) Voita's query tokens
        js = None
        if self._js_sum is not None:
            sampled = js_sample_rows(n, js_row_budget(n, self.js_max_rows))
            js = (sentence_js_sums(p[0][:, sampled, :], self.js_smoothing), sampled.size)  # (N, rows, n)
        self.add_sentence_sums(
            {name: v[0] for name, v in values.items()},
            length=n,
            confidence=(p[0].max(axis=-1)[:, rows].sum(axis=-1), int(rows.sum())),
            histogram=self._histogram(block, rows),
            js=js,
        )

    def _histogram(self, block: RowBlock, rows: np.ndarray) -> np.ndarray:
        """``(N, 2·n − 1)`` argmax-offset counts of one sentence's block of n keys over its query rows ``(n,)``."""
        import torch

        n = block.w.shape[-1]
        hist = torch.zeros(block.w.shape[1], 2 * n - 1, dtype=torch.int64)
        count_offsets(hist, row_max_offsets(block)[1], torch.as_tensor(rows[None]), n)
        return hist.numpy()

    def _add_histogram(self, histogram: np.ndarray | None, name: str = "histogram") -> None:
        """Add ``(N, 2·m − 1)`` offset counts (offsets −(m − 1) … m − 1, any m ≤ max_length) to the running histogram,
        widening it to the largest offset counted."""
        if histogram is None:
            return
        h = np.asarray(histogram)
        n, width = self._hist.shape[0], h.shape[-1] if h.ndim == 2 else 0
        if h.ndim != 2 or h.shape[0] != n or width % 2 == 0 or width > 2 * self.max_length - 1:
            raise ValueError(
                f"{name}: expected ({n}, 2·m − 1) offset counts with m ≤ max_length={self.max_length}, "
                f"got shape {tuple(h.shape)}"
            )
        counted = np.flatnonzero(h.any(axis=0))
        if counted.size == 0:
            return
        c = (width - 1) // 2
        reach = int(max(c - counted[0], counted[-1] - c))  # the largest |offset| counted
        span = (self._hist.shape[-1] - 1) // 2
        if reach > span:
            wider = np.zeros((n, 2 * reach + 1), dtype=np.int64)
            wider[:, reach - span : reach + span + 1] = self._hist
            self._hist, span = wider, reach
        self._hist[:, span - reach : span + reach + 1] += h[:, c - reach : c + reach + 1]

    def add_sentence_sums(
        self,
        values: dict[str, np.ndarray],
        *,
        length: int,
        confidence: tuple[np.ndarray, int],
        histogram: np.ndarray | None,
        js: tuple[np.ndarray, int] | None,
    ) -> None:
        """Add one sentence already reduced (the streaming pass, :mod:`headwise.analysis.streaming`, reduces rows
        inside attention and hands the same quantities here).

        Args:
            values: each sentence metric → ``(N,)`` (NaN: the sentence has no such row).
            length: n, its real tokens.
            confidence: ``(sum of the row maxima (N,), rows counted)`` over Voita's query tokens.
            histogram: ``(N, 2·m − 1)`` argmax-offset counts, offsets −(m − 1) … m − 1 for any m ≤ ``max_length``
                (None: none to add, e.g. a batch's histogram already added with its first sentence).
            js: ``(JS sums (N, N), rows summed)`` over the sampled rows, or None.
        """
        for name, v in values.items():
            ok = ~np.isnan(v)
            self._sum[name] += np.where(ok, v, 0.0)
            self._count[name] += ok
        self._uniform_sum += math.log(length)
        self._conf_sum += confidence[0]
        self._conf_count += int(confidence[1])
        self._add_histogram(histogram)
        if self._js_sum is not None and js is not None:
            self._js_sum += js[0]
            self._js_rows += int(js[1])
        self.num_sentences += 1
        self.num_tokens += length

    def state(self) -> dict:
        """The running sums as float64 tensors, name → tensor (counts included, exact below 2⁵³): what a
        data-parallel run all-reduces, saves per shard and adds back with :meth:`add_state`.

        Keys: ``sum.<metric>`` / ``count.<metric>`` ``(N,)``, ``uniform_sum`` ``()``, ``conf_sum`` ``(N,)``,
        ``conf_count`` ``()``, ``hist`` ``(N, 2·max_length − 1)``, ``js_sum`` ``(N, N)`` and ``js_rows`` ``()``
        (with ``js``), ``num_sentences``, ``num_tokens`` ``()``.
        """
        import torch

        def f64(v):
            return torch.as_tensor(np.asarray(v, dtype=np.float64)).clone()

        out = {f"sum.{m}": f64(self._sum[m]) for m in _SENTENCE_METRICS}
        out |= {f"count.{m}": f64(self._count[m]) for m in _SENTENCE_METRICS}
        m, span = self.max_length, (self._hist.shape[-1] - 1) // 2
        hist = np.zeros((self._hist.shape[0], 2 * m - 1))
        hist[:, m - 1 - span : m + span] = self._hist
        out |= {"uniform_sum": f64(self._uniform_sum), "conf_sum": f64(self._conf_sum), "hist": f64(hist)}
        out |= {"conf_count": f64(self._conf_count)}
        if self._js_sum is not None:
            out |= {"js_sum": f64(self._js_sum), "js_rows": f64(self._js_rows)}
        out |= {"num_sentences": f64(self.num_sentences), "num_tokens": f64(self.num_tokens)}
        return out

    def add_state(self, state) -> None:
        """Add partial sums (another accumulator's :meth:`state`, or a sum of several) to this one.

        Raises:
            ValueError: ``state`` lacks a key, has one more, or a tensor of another shape (another model, another
                ``max_length`` or ``js``).
        """
        mine = self.state()
        check_state("state", mine, state)

        def ints(name):
            return np.rint(np.asarray(state[name], dtype=np.float64)).astype(np.int64)

        for m in _SENTENCE_METRICS:
            self._sum[m] += np.asarray(state[f"sum.{m}"], dtype=np.float64)
            self._count[m] += ints(f"count.{m}")
        self._uniform_sum += float(state["uniform_sum"])
        self._conf_sum += np.asarray(state["conf_sum"], dtype=np.float64)
        self._conf_count += int(ints("conf_count"))
        self._add_histogram(ints("hist"), "state['hist']")
        if self._js_sum is not None:
            self._js_sum += np.asarray(state["js_sum"], dtype=np.float64)
            self._js_rows += int(ints("js_rows"))
        self.num_sentences += int(ints("num_sentences"))
        self.num_tokens += int(ints("num_tokens"))

    def result(self) -> HeadReport:
        """The aggregated :class:`HeadReport` (the accumulator stays usable).

        Raises:
            ValueError: no sentence was added.
        """
        if self.num_sentences == 0:
            raise ValueError("corpus: expected at least one sentence with a real token, got none")
        shape = (self.num_layers, self.num_heads)
        metrics = {}
        with np.errstate(invalid="ignore", divide="ignore"):
            for name in _SENTENCE_METRICS:
                c = self._count[name]
                metrics[name] = np.where(c > 0, self._sum[name] / np.maximum(c, 1), np.nan).reshape(shape)
            conf = self._conf_sum / self._conf_count if self._conf_count else np.full(self._conf_sum.shape, np.nan)
        metrics["uniform_entropy"] = np.full(shape, self._uniform_sum / self.num_sentences)
        metrics["confidence"] = conf.reshape(shape)
        share, offset, positional = positional_from_histogram(self._hist)
        metrics["positional_share"] = share.reshape(shape)
        metrics["positional_offset"] = offset.reshape(shape)
        metrics = {name: metrics[name] for name in METRICS}
        js_div = js_dist = mds = None
        if self._js_sum is not None:
            js_div = self._js_sum / self._js_rows
            js_dist = np.sqrt(js_div)
            mds = classical_mds(js_dist, 2)
        return HeadReport(
            metrics=metrics,
            positional=positional.reshape(shape),
            roles=head_roles(metrics, self.thresholds),
            js_divergence=js_div,
            js_distance=js_dist,
            mds=mds,
            num_sentences=self.num_sentences,
            num_tokens=self.num_tokens,
            thresholds=self.thresholds,
        )


def check_state(name: str, expected, got) -> None:
    """ValueError naming ``name`` unless ``got`` has the keys of ``expected`` and tensors of the same shapes (the
    check of every accumulator's ``add_state``)."""
    if set(got) != set(expected):
        missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
        raise ValueError(f"{name}: expected the keys of this accumulator, missing {missing}, unexpected {extra}")
    for key, value in expected.items():
        shape = tuple(np.shape(got[key]))
        if shape != tuple(value.shape):
            raise ValueError(f"{name}: '{key}' expected shape {tuple(value.shape)}, got {shape}")


#: What an ``attend`` function returns for a list of texts: per-layer ``(B, H, L, L)`` maps and token info
#: (a :class:`TokenInfo`, or a tokenizer's batch with ``tokens`` and ``attention_mask``).
AttentionBatch = tuple[Sequence, object]


def _batches(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for t in texts:
        batch.append(t)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def analyze_texts(
    texts: Iterable[str],
    attend: Callable[[list[str]], AttentionBatch],
    *,
    num_layers: int,
    num_heads: int,
    max_length: int = 512,
    batch_size: int = 32,
    progress: Callable[[int, int], None] | None = None,
    js: bool = True,
    thresholds: RoleThresholds | None = None,
) -> HeadReport:
    """Run ``attend`` over texts in batches and aggregate every head metric (streaming).

    Args:
        texts: any iterable of texts (read lazily: a :class:`CorpusFile` streams a file).
        attend: maps a list of B texts to ``(attentions, info)``: NL arrays ``(B, H, L, L)`` and their
            :class:`TokenInfo`, or the tokenizer's batch (see :func:`~headwise.analysis.tokens.as_token_info`;
            e.g. :func:`headwise.models.model_attend`).
        num_layers, num_heads, max_length: the model's NL, H and longest input.
        batch_size: texts per call of ``attend``.
        progress: called after every batch with ``(texts, tokens)``, the numbers of texts and of real
            tokens aggregated so far (the command line draws its progress bar with it); None: silent.
        js: compute the Jensen–Shannon distances and the MDS map.
        thresholds: role thresholds.
    Returns:
        The :class:`HeadReport`.
    Raises:
        ValueError: ``batch_size`` < 1, no text.
    """
    checks.positive_int("batch_size", batch_size)
    stats = HeadStats(num_layers, num_heads, max_length=max_length, js=js, thresholds=thresholds)
    done = 0
    for batch in _batches(texts, batch_size):
        stats.update(*attend(batch))
        done += len(batch)
        if progress is not None:
            progress(done, stats.num_tokens)
    return stats.result()
