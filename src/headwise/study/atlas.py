"""An atlas of every head: the corpus pass's observer and the one record of each head (``atlas.json``, format
``headwise.atlas/1``, documented in docs/heads.md), assembled from the statistics, the evidence, the writes, the
importance and the weights' circuits.

Shape legend: NL layers, H query heads, V vocabulary.

:class:`AtlasPass` rides on the statistics' own forward pass (:func:`headwise.study.decoder.decoder_report`'s
``observe``): per batch it counts the corpus's tokens, keeps the texts' token ids a context needs, and reads what every
head writes (:class:`~headwise.study.atlas_writes.HeadWrites`); the attention evidence is read by the pass's block
readers. :func:`atlas_dict` turns the pieces into the records the page and the library read. Every magnitude says
whether it is exact or an estimate, and an estimate carries the error measured on this run.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import numpy as np

from headwise.circuits.graph import head_id
from headwise.study.heads_lines import ordinal
from headwise.study.importance_estimate import spearman_or_none

__all__ = ["ATLAS_FORMAT", "AtlasPass", "PARTNERS", "atlas_dict", "loss_agreement", "summary_lines"]

#: The format name ``atlas.json`` carries.
ATLAS_FORMAT = "headwise.atlas/1"
#: Composition partners kept per head and direction.
PARTNERS = 5
#: The evidence's mark of tokens that are punctuation or a line break (the delimiter role's).
DELIMITER = "punctuation"
#: An encoder's evidence also marks its separator tokens (BERT's [SEP], a sink of its own: Clark et al. 2019).
SEPARATOR = "separator"
#: Source tokens of the OV mappings (the corpus's most frequent) and target tokens read (its most frequent).
OV_SOURCES, OV_TARGETS = 64, 4096


def _num(v) -> float | None:
    """A JSON number: None for NaN / inf / missing."""
    if v is None:
        return None
    v = float(v)
    return None if not math.isfinite(v) else round(v, 6)


class AtlasPass:
    """What the atlas reads in the statistics' pass besides the statistics: the corpus's token counts, the attention
    evidence (:class:`~headwise.analysis.evidence.HeadEvidence`, the delimiter mark; an encoder's separators too) and
    what every head writes (:class:`~headwise.study.atlas_writes.HeadWrites`, decoders with an unembedding).

    Args:
        hm: the model (a decoder's anatomy read for the written tokens).
        top, context: contexts kept per head and tokens of each snippet.
        texts: the corpus's texts, when known (the direct loss effect's sample set from the first batch).
    Use: a decoder's batch ``with atlas_pass(ids, mask, first_text) as readers: <the batch's pass with extra=readers>``
    (:func:`headwise.study.decoder.decoder_report`'s ``observe``); an encoder's full maps :meth:`read_maps`.
    """

    def __init__(self, hm, *, top: int = 8, context: int = 24, texts: int | None = None):
        from headwise.analysis.evidence import HeadEvidence
        from headwise.study.atlas_writes import HeadWrites

        self.hm = hm
        vocab = hm.vocab_size or 0
        self.counts = np.zeros(max(vocab, 1), dtype=np.int64)
        decoder = hm.kind == "decoder"
        writes = decoder and hm.anatomy.unembed is not None
        self.writes = HeadWrites(hm, top=top, context=context, texts=texts) if writes else None
        # a head's fallback on the current token would fill its top with rows of weight ≈ 1: the strongest other key
        marks = (DELIMITER,) if decoder else (DELIMITER, SEPARATOR)
        self.evidence = HeadEvidence(hm.num_layers, hm.max_heads, top=top, context=context, marks=marks,
                                     skip_self=True, causal=decoder)  # fmt: skip
        self._first_text = 0
        self._delimiter: dict[int, bool] = {}

    def delimiters(self, ids: np.ndarray) -> np.ndarray:
        """``ids``'s shape, bool: the tokens whose text is punctuation or a line break alone (:data:`DELIMITER`)."""
        for i in np.unique(ids).tolist():
            if i not in self._delimiter:
                self._delimiter[i] = _is_delimiter(self.hm, i)
        return np.vectorize(lambda i: self._delimiter[int(i)], otypes=[bool])(ids)

    @contextlib.contextmanager
    def __call__(self, ids, mask, first_text: int):
        ids_np, mask_np = np.asarray(ids), np.asarray(mask).astype(bool)
        real = ids_np[mask_np]
        real = real[(real >= 0) & (real < self.counts.shape[0])]
        self.counts += np.bincount(real, minlength=self.counts.shape[0])[: self.counts.shape[0]]
        marks = {DELIMITER: self.delimiters(ids_np) & mask_np}
        readers = [self.evidence.reader(first_text=first_text, marks=marks)]
        if self.writes is None:
            yield readers
            return
        with self.writes.batch(ids_np, mask_np, first_text):
            yield readers

    def read_maps(self, maps, info) -> None:
        """An encoder's batch: its full maps (NL arrays ``(B, H, L, L)``, as :func:`headwise.analysis.analyze_texts`
        reads them) with their :class:`~headwise.analysis.TokenInfo`, each layer's map one block of the evidence (the
        ids read back from the tokens' strings; punctuation as the info marks it)."""
        import torch

        from headwise.analysis.row_readers import Layout
        from headwise.analysis.tokens import as_token_info

        given = getattr(info, "input_ids", None)  # a tokenizer's batch carries its ids
        info = as_token_info(info)
        valid = np.asarray(info.valid, dtype=bool)
        if given is not None:
            ids = np.asarray(given, dtype=np.int64)
        else:  # the ids read back from the tokens' strings
            ids = np.zeros(valid.shape, dtype=np.int64)
            for b, tokens in enumerate(info.tokens or ()):
                ids[b, : len(tokens)] = [self.hm.tokenizer.token_to_id(t) or 0 for t in tokens]
        layout = Layout(ids, info)
        marks = {
            DELIMITER: np.asarray(info.punct, dtype=bool) & valid,
            SEPARATOR: np.asarray(info.sep, dtype=bool) & valid,
        }
        reader = self.evidence.batch(layout, first_text=self._first_text, marks=marks)
        with torch.no_grad():
            for layer, m in enumerate(maps):
                reader.block(layer, layout.block(torch.as_tensor(np.asarray(m, dtype=np.float32)), 0))
        self._first_text += valid.shape[0]
        real = ids[valid]
        self.counts += np.bincount(real[real < self.counts.shape[0]], minlength=self.counts.shape[0])

    def frequent(self, n: int, *, exclude=()) -> np.ndarray:
        """The ``n`` most frequent token ids of the corpus read (ties by id), without ``exclude``."""
        counts = self.counts.copy()
        counts[[i for i in exclude if 0 <= i < counts.shape[0]]] = 0
        order = np.lexsort((np.arange(counts.shape[0]), -counts))
        return order[: min(n, int((counts > 0).sum()))]


def _is_delimiter(hm, i: int) -> bool:
    """Whether token ``i``'s text is punctuation or line breaks alone (Unicode categories P*, and ``\\n``)."""
    import unicodedata

    try:
        text = hm.tokenizer.decode([int(i)])
    except Exception:  # noqa: BLE001 - an id the tokenizer cannot decode is no delimiter
        return False
    text = text.strip(" \t")
    return bool(text) and all(c == "\n" or unicodedata.category(c).startswith("P") for c in text)


def _stats(report, layer: int, head: int) -> dict:
    keep = ("first", "cls", "sep", "punct", "prev", "next", "self", "entropy", "entropy_ratio", "entropy_ratio_causal",
            "distance", "duplicate", "induction", "induction_probe", "duplicate_probe", "confidence",
            "positional_offset", "positional_share")  # fmt: skip
    return {k: _num(report.metrics[k][layer, head]) for k in keep if k in report.metrics}


def _tokens(hm, ids) -> list[str]:
    """What a reader sees of a snippet's ids (-1: a gap, shown as "…")."""
    out, run = [], []
    for i in [*ids, -1]:
        if i >= 0:
            run.append(int(i))
            continue
        if run:
            out.extend(hm.token_texts(run))
            run = []
        out.append("…")
    return out[:-1]


def _partners(scores: dict | None, layer: int, head: int) -> dict | None:
    """Strongest senders into the head and receivers of it (Q-, K-, V-composition), :data:`PARTNERS` each."""
    if not scores:
        return None
    ins, outs = [], []
    for kind in ("q", "k", "v"):
        grid = scores.get(kind)
        if grid is None:
            continue
        for sl, sender in enumerate(grid):  # [sender layer][sender head][layer][head]
            for sh, row in enumerate(sender):
                v = row[layer][head] if layer < len(row) and head < len(row[layer]) else None
                if v is not None:
                    ins.append({"head": head_id(sl, sh), "kind": kind.upper(), "score": _num(v)})
        for rl, receivers in enumerate(grid[layer][head]):
            for rh, v in enumerate(receivers):
                if v is not None:
                    outs.append({"head": head_id(rl, rh), "kind": kind.upper(), "score": _num(v)})
    ins.sort(key=lambda p: -(p["score"] or 0))
    outs.sort(key=lambda p: -(p["score"] or 0))
    return {"in": ins[:PARTNERS], "out": outs[:PARTNERS]}


def loss_agreement(found) -> dict:
    """The direct loss effect's sample (``sample_tokens`` of ``predicted_tokens``, every ``stride``-th) and its estimate
    against exact on the first ``tokens`` predicted tokens: Spearman over heads, sign agreement, median ratio estimate
    / exact (heads whose exact effect is at least 1 % of the largest)."""
    est, ex = found.estimate_sample.ravel(), found.exact_sample.ravel()
    ok = np.isfinite(est) & np.isfinite(ex)
    big = ok & (np.abs(ex) >= 0.01 * np.nanmax(np.abs(ex[ok]))) if ok.any() else ok
    return {
        "sample_tokens": int(found.loss_tokens),
        "predicted_tokens": int(found.predicted),
        "stride": int(found.stride),
        "tokens": int(found.sampled),
        "spearman": _num(spearman_or_none(est, ex)),
        "sign": _num(np.mean(np.sign(est[big]) == np.sign(ex[big]))) if big.any() else None,
        "median_ratio": _num(np.median(est[big] / ex[big])) if big.any() else None,
    }


def atlas_dict(
    hm,
    report,
    atlas_pass: AtlasPass,
    *,
    corpus: str,
    importance: dict | None = None,
    composition: dict | None = None,
    copying: np.ndarray | None = None,
) -> dict:
    """``atlas.json``'s dict (format :data:`ATLAS_FORMAT`): every head's roles with their evidence
    (:func:`headwise.analysis.atlas_roles`), statistics, offsets, contexts, writes, importance and partners.

    Args:
        report: the statistics (:class:`~headwise.analysis.DecoderReport`).
        atlas_pass: the pass's :class:`AtlasPass` after the corpus.
        corpus: what the corpus is, as said to the reader.
        importance: ``{"columns": {name: (NL, H)}, "header": dict}`` of the importance run, or None.
        composition: the weights' circuits' summary (full ``q`` / ``k`` / ``v`` grids), or None.
        copying: ``(NL, H)`` the copying scores of the weights' circuits (the copying role), or None.
    """
    from headwise.analysis.atlas_roles import ATLAS_ROLES, AtlasThresholds, atlas_roles

    NL, H = hm.num_layers, hm.max_heads
    heads_per = list(hm.heads_per_layer)
    written = atlas_pass.writes.result() if atlas_pass.writes is not None else None
    raised = atlas_pass.writes.written(written) if written is not None else None
    ov = None
    if atlas_pass.writes is not None and atlas_pass.counts.any():
        import torch

        from headwise.study.atlas_writes import ov_mappings

        special = list(getattr(hm, "special_ids", ()) or ())
        sources = torch.from_numpy(atlas_pass.frequent(OV_SOURCES, exclude=special)).long()
        targets = torch.from_numpy(atlas_pass.frequent(OV_TARGETS)).long()
        if sources.numel():
            ov = ov_mappings(hm, sources, targets)
    agreement = loss_agreement(written) if written is not None else None
    loss_label = None
    if agreement is not None:
        every = "every" if written.stride == 1 else f"every {ordinal(written.stride)}"
        loss_label = (
            "estimate: first-order change of the next-token loss when the head's direct write is removed (final "
            f"norm frozen), mean over {written.loss_tokens} of the corpus's {written.predicted} predicted tokens "
            f"({every} one; ± its standard error there); on {agreement['tokens']} tokens measured exactly — Spearman "
            f"{_fmt(agreement['spearman'])} over heads, signs agree {_fmt(agreement['sign'])}, median ratio "
            f"{_fmt(agreement['median_ratio'])}"
        )
    imp = _importance(importance)
    evidence = atlas_pass.evidence.result()
    found = atlas_roles(report, evidence, copying=copying)
    thresholds = AtlasThresholds()
    legend = [{"name": n, "description": d, "threshold": thresholds.for_role(n)} for n, d in ATLAS_ROLES]
    heads = []
    for layer in range(NL):
        for head in range(heads_per[layer]):
            named = [
                {"name": r.name, "score": _num(r.score), "threshold": _num(r.threshold), "detail": r.detail}
                for r in found.roles[layer][head]
            ]
            card = {
                "id": head_id(layer, head),
                "layer": layer,
                "head": head,
                "role": str(found.primary[layer, head]),
                "roles": named,
                "stats": _stats(report, layer, head),
                "offsets": _offsets(evidence, layer, head),
                "contexts": [_context(hm, c) for c in evidence.contexts[layer][head]],
                "outputs": [],
                "writes": None,
                "ov": None,
                "loss_effect": None,
                "importance": imp(layer, head),
                "partners": _partners(composition, layer, head),
            }
            if written is not None:
                card["outputs"] = [
                    {"tokens": _tokens(hm, ids), "at": at, "norm": _num(norm), "text": text, "position": pos}
                    for norm, text, pos, ids, at in written.top[layer][head]
                ]
                ups, downs = raised[layer][head]
                card["writes"] = {
                    "raises": [{"token": hm.token_texts([i])[0], "value": _num(v)} for i, v in ups],
                    "lowers": [{"token": hm.token_texts([i])[0], "value": _num(v)} for i, v in downs],
                    "label": f"mean direct logit attribution over the corpus's {written.tokens} tokens (exact: the "
                    "head's write through the final norm frozen at each token and the unembedding, before any "
                    "soft-cap)",
                }
                card["loss_effect"] = {
                    "value": _num(written.loss_effect[layer, head]),
                    "stderr": _num(written.loss_stderr[layer, head]),
                    "exact": False,
                    "label": loss_label,
                    "exact_on_sample": _num(written.exact_sample[layer, head]),
                }
            if ov is not None:
                m = ov[layer][head]
                card["ov"] = {
                    "copying": _num(copying[layer, head]) if copying is not None else None,
                    "copying_share": _num(m["copying"]),
                    "top": [
                        {"from": hm.token_texts([s])[0], "to": hm.token_texts([t])[0], "value": _num(v)}
                        for s, t, v in m["top"]
                    ],
                }
            heads.append(card)
    return {
        "format": ATLAS_FORMAT,
        "model": {
            "name": hm.name,
            "kind": hm.kind,
            "family": hm.family,
            "num_layers": NL,
            "num_heads": H,
            "kv_heads": _kv_heads(hm),
        },
        "corpus": {"source": corpus, "texts": int(report.num_sentences), "tokens": int(report.num_tokens)},
        "roles": legend,
        "importance": None if importance is None else importance.get("header"),
        "loss_effect": agreement,
        "heads": heads,
    }


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def _kv_heads(hm) -> int | None:
    try:
        return int(hm.anatomy[0].num_kv)
    except Exception:  # noqa: BLE001 - a structure the anatomy does not read has no group count to show
        return None


def _offsets(evidence, layer: int, head: int) -> dict:
    """A head's attention by offset: ``shares[i]`` at ``d = start + i`` (query − key), beyond them, on the first
    token, and on each mark."""
    return {
        "start": int(evidence.start),
        "shares": [_num(v) for v in evidence.offsets[layer, head]],
        "beyond": _num(evidence.beyond[layer, head]),
        "first": _num(evidence.first[layer, head]),
        "marks": {name: _num(v[layer, head]) for name, v in evidence.marks.items()},
    }


def _context(hm, c) -> dict:
    return {
        "tokens": _tokens(hm, c.ids),
        "query": int(c.query_at),
        "key": int(c.key_at),
        "weight": _num(c.weight),
        "text": int(c.text),
        "position": int(c.query),
    }


def _importance(importance: dict | None) -> Callable[[int, int], dict | None]:
    """Per head: the exact ablation where it was measured, else the estimate labelled with the run's error."""
    if importance is None:
        return lambda layer, head: None
    cols = importance["columns"]
    exact = cols.get("ablation_delta")
    estimate = cols.get("ablation_estimate")
    header = importance.get("header") or {}
    agreement = header.get("agreement") or {}
    est_label = f"estimate ({header.get('estimator') or 'first order'})"
    if agreement:
        est_label += (
            f"; this run's error over the {agreement.get('heads', '?')} heads measured: Spearman "
            f"{_fmt(_num(agreement.get('spearman')))}"
        )
    order = None
    basis = exact if exact is not None else estimate
    if basis is not None:
        merged = np.where(np.isfinite(exact), exact, estimate) if exact is not None and estimate is not None else basis
        flat = np.nan_to_num(np.abs(np.asarray(merged, dtype=float)), nan=-1).ravel()
        order = np.empty(flat.size, dtype=int)
        order[np.argsort(-flat, kind="stable")] = np.arange(flat.size)

    def one(layer: int, head: int) -> dict | None:
        H = (exact if exact is not None else estimate).shape[1]
        rank = None if order is None else int(order[layer * H + head]) + 1
        if exact is not None and np.isfinite(exact[layer, head]):
            return {"value": _num(exact[layer, head]), "exact": True, "rank": rank,
                    "label": "measured: the loss change when the head is ablated, on this run"}  # fmt: skip
        if estimate is not None and np.isfinite(estimate[layer, head]):
            return {"value": _num(estimate[layer, head]), "exact": False, "rank": rank, "label": est_label}
        return None

    return one


def summary_lines(data: dict, *, per_role: int = 3) -> list[str]:
    """What fits a screen of an atlas (``atlas_dict``'s dict): each role counted with its strongest heads (by
    |importance| where measured or estimated, else in order), and how the estimates were checked — every head's row
    stays in the files."""
    heads = data["heads"]
    order = [r["name"] for r in data["roles"]]
    by_role: dict[str, list[dict]] = {}
    for h in heads:
        by_role.setdefault(h["role"], []).append(h)
    model, corpus = data["model"], data["corpus"]
    lines = [
        f"{model['name']}: {len(heads)} heads ({model['num_layers']} layers × {model['num_heads']}) read over "
        f"{corpus['texts']} texts of {corpus['source']} ({corpus['tokens']} tokens)"
    ]

    def strength(h: dict) -> float:
        imp = h.get("importance") or {}
        return abs(imp.get("value") or 0.0)

    width = max((len(r) for r in by_role), default=0)
    for role in [*order, *sorted(set(by_role) - set(order))]:
        members = by_role.get(role)
        if not members:
            continue
        top = sorted(members, key=lambda h: (-strength(h), h["layer"], h["head"]))[:per_role]
        names = ", ".join(h["id"] + ("*" if (h.get("importance") or {}).get("exact") else "") for h in top)
        lines.append(f"  {role:<{width}}  {len(members):>4}  {names}")
    imp = data.get("importance")
    if imp:
        agreement = imp.get("agreement") or {}
        lines.append(
            f"importance: {imp['measured']} of {imp['of']} heads measured exactly (*)"
            + (f" ({imp['search']})" if imp.get("search") else "")
            + (f"; estimate's Spearman over them {_fmt(_num(agreement.get('spearman')))}" if agreement else "")
        )
    loss = data.get("loss_effect")
    if loss:
        sample = ""
        if loss.get("sample_tokens") is not None and loss["sample_tokens"] < loss.get("predicted_tokens", 0):
            sample = f" over {loss['sample_tokens']:,} of {loss['predicted_tokens']:,} tokens"
        lines.append(
            f"direct loss effects are first-order estimates{sample}; on {loss['tokens']} tokens measured exactly: "
            "Spearman "
            f"{_fmt(loss['spearman'])}, signs agree {_fmt(loss['sign'])}, median ratio {_fmt(loss['median_ratio'])}"
        )
    return lines
