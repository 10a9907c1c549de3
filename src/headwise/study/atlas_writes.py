"""What every head writes over a corpus, gathered in the statistics' own pass: the tokens its write raises and lowers
through the unembedding, its direct effect on the next-token loss, and where its write is largest.

Shape legend: B batch, L length, N real tokens of a batch, NL layers, H query heads, Dv value head width, D model
width, V vocabulary, k kept contexts, F source tokens and T target tokens of the OV mappings.

Each head's write at a token is ``w = z_h · W_O[h]`` (:meth:`~headwise.models.anatomy.LayerAnatomy.head_writes`),
through a norm on the attention's write frozen at the run and times the layer's multiplier — the parts
:func:`headwise.patching.direct_logit_attribution` splits a logit difference into, at every token instead of one.

- **Written tokens** (direct logit attribution over the corpus; Elhage et al. 2021, nostalgebraist's logit lens
  applied to one head): the final norm frozen at each token makes the head's share of the logits linear,
  ``U · lin_t(w_t)``; its mean over the corpus's tokens is ``U · mean_t lin_t(w_t)``, so one ``(D,)`` sum per head is
  kept and projected once at the end (times the model's logit scale; before any soft-cap). Exact for that
  definition.
- **Direct effect on the loss**: the first-order change of the next-token loss when the head's direct write is
  removed from the final residual stream, ``lin_t(w_t) · U^T (e_{y_t} − p_t)`` (the soft-cap's derivative included),
  mean over predicted tokens: positive where the head's write helps the model predict the next token. Each token
  costs a softmax over the vocabulary, so it is measured on every ``s``-th predicted token of the corpus, ``s`` the
  smallest power of two that keeps at most :func:`loss_budget` tokens (``2^29`` logits, at most
  :data:`LOSS_TOKENS`: SmolLM2's 49,152-token vocabulary 8,192 tokens, Gemma 3's 262,144 2,048) — each kept token's
  effects are held, the stride doubled and every other one dropped when the budget is passed, so the sample spreads
  over the whole corpus whatever its length; each head's standard error over the sample is kept beside its mean. It
  is an estimate; on the first :data:`EXACT_TOKENS` predicted tokens every head's effect is also computed exactly (the
  final norm recomputed on ``x − w``, the full softmax), and the estimate's Spearman, sign agreement and median ratio
  to exact on those tokens are reported beside it.
- **Where the write is largest**: the ``k`` tokens of the corpus with the largest ``‖w_t‖`` (after the post-norm and
  multiplier), each with a snippet of its text.
- **The OV circuit's token mappings** (:func:`ov_mappings`): the most frequent tokens of the corpus embedded, through
  the layer's input norm, the head's values and output, the final norm's gain and the unembedding, read over the
  corpus's tokens: each source's strongest target, and the share of sources whose strongest target is themselves.

Memory beyond the pass: every layer's heads' outputs of one batch ``NL · B · L · H · Dv · 4`` bytes, one layer's
writes ``N · H · D · 4``, a chunk of logits and its softmax ``2 · 2^24 · 4`` bytes, the sampled tokens' effects
``2 · LOSS_TOKENS · NL · H · 4`` and ``NL · H · (D + k)`` sums — bounded at any corpus length.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from headwise.points import layer_point

__all__ = ["EXACT_TOKENS", "LOSS_TOKENS", "HeadWrites", "WrittenTokens", "loss_budget", "ov_mappings"]

#: Predicted tokens on which every head's direct effect on the loss is also computed exactly (the estimate's error).
EXACT_TOKENS = 16
#: Most predicted tokens the direct loss effect keeps (:func:`loss_budget`).
LOSS_TOKENS = 8192
#: Logits (tokens × vocabulary) the direct loss effect's sample may cost: 2^29, about 0.7 TFLOP at D = 640.
_LOSS_LOGITS = 1 << 29
#: Elements of one chunk of logits (tokens × vocabulary): 64 MB of float32, the softmax taking the logits' place (a
#: chunk of 2^25 held 0.5 GB at its peak on SmolLM2 before the softmax's products were made in place); Gemma 3's
#: vocabulary gets 64 tokens a chunk (32 ran its matrix products at half their rate of 512).
_LOGIT_ELEMENTS = 1 << 24


def loss_budget(vocab: int) -> int:
    """The most predicted tokens the direct loss effect keeps for a vocabulary of ``vocab``: ``2^29 / vocab``, at least
    :data:`EXACT_TOKENS` and at most :data:`LOSS_TOKENS`."""
    return int(min(LOSS_TOKENS, max(EXACT_TOKENS, _LOSS_LOGITS // max(vocab, 1))))


@dataclass
class WrittenTokens:
    """What :class:`HeadWrites` found (float64 numpy arrays; ``NaN`` where a layer has fewer heads).

    Attributes:
        mean_write: ``(NL, H, D)`` each head's mean write through the frozen final norm, over ``tokens`` tokens.
        loss_effect: ``(NL, H)`` the first-order direct effect on the next-token loss (nats, mean over the
            ``loss_tokens`` sampled of the ``predicted`` tokens, every ``stride``-th; positive: the write lowers the
            loss); loss_stderr: ``(NL, H)`` its standard error over the sample.
        exact_sample, estimate_sample: ``(NL, H)`` on the first ``sampled`` predicted tokens, the exact direct effect
            and the estimate (means over those tokens).
        top: ``[layer][head]`` up to k ``(norm, text, position, ids, at)`` records, largest first.
    """

    mean_write: np.ndarray
    loss_effect: np.ndarray
    loss_stderr: np.ndarray
    loss_tokens: int
    stride: int
    exact_sample: np.ndarray
    estimate_sample: np.ndarray
    sampled: int
    tokens: int
    predicted: int
    top: list


def _float32(frozen):
    """A frozen norm's linear part on float32 parts (its per-row scale and gain, read in float64, cast once);
    the identity for None."""
    if frozen is None:
        return lambda v: v
    gain, inv = frozen.gain.float(), frozen.inv.float()

    def lin(v: Tensor) -> Tensor:  # (N, …, D)
        if frozen.centred:
            v = v - v.mean(-1, keepdim=True)
        return v * gain.to(v.device) * inv.to(v.device).reshape(inv.shape[0], *([1] * (v.dim() - 1)))

    return lin


def _snippet(row: np.ndarray, position: int, n: int, context: int) -> tuple[tuple[int, ...], int]:
    """Token ids of ``row`` ending one past ``position`` (at most ``context`` of them) and ``position``'s index."""
    stop = min(n, position + 2)
    start = max(0, stop - context)
    return tuple(int(i) for i in row[start:stop]), position - start


class HeadWrites:
    """Every head's written tokens, direct effect on the loss and largest writes over a corpus, one batch at a time:
    ``with writes.batch(ids, mask, first_text): <the batch's forward pass>`` (the heads' outputs and the final
    residual stream read at ``layers.{i}.attn.heads`` and ``resid_final``), then :meth:`result`.

    Args:
        hm: a decoder :class:`~headwise.models.HeadModel` whose anatomy is read (its unembedding, final norm, every
            layer's output projection).
        top: largest writes kept per head; context: tokens of each snippet.
        exact_tokens: predicted tokens on which the loss effect is also computed exactly.
        loss_tokens: the most predicted tokens the loss effect keeps (None: :func:`loss_budget` of the vocabulary).
        texts: the corpus's texts, when known: after the first batch the stride is set from its predicted tokens a
            text, so that later batches compute only the tokens the sample will keep.
    Raises:
        ValueError: a model without an unembedding (an encoder), in the anatomy's one sentence.
    """

    def __init__(
        self,
        hm,
        *,
        top: int = 8,
        context: int = 24,
        exact_tokens: int = EXACT_TOKENS,
        loss_tokens: int | None = None,
        texts: int | None = None,
    ):
        self.hm = hm
        self.anatomy = anatomy = hm.anatomy
        if anatomy.unembed is None:
            raise anatomy.refuse("its written tokens (no unembedding)")
        self.top_k, self.context, self.exact_tokens = top, context, exact_tokens
        NL, H, D = hm.num_layers, hm.max_heads, hm.width
        self.budget = loss_budget(hm.vocab_size or 1) if loss_tokens is None else loss_tokens
        if self.budget < 1:
            raise ValueError(f"loss_tokens: expected at least 1 token, got {loss_tokens}")
        self.heads = list(hm.heads_per_layer)
        self.sums = torch.zeros(NL, H, D, dtype=torch.float64)
        self.texts, self.seen = texts, 0
        self.stride = 1  # every stride-th predicted token of the corpus is sampled (a power of two)
        self.kept_at: list[Tensor] = []  # the sampled tokens' indices among the corpus's predicted tokens, (m,) each
        self.kept: list[Tensor] = []  # their effects, (m, NL, H) float32 each
        self.exact = torch.zeros(NL, H, dtype=torch.float64)
        self.estimate = torch.zeros(NL, H, dtype=torch.float64)
        self.tokens = self.predicted = self.sampled = 0
        self.best = torch.full((NL, H, top), -1.0, dtype=torch.float64)  # the k largest norms, -1: none yet
        self.where: list[list[list]] = [[[None] * top for _ in range(H)] for _ in range(NL)]

    @contextlib.contextmanager
    def batch(self, ids, mask, first_text: int):
        """Around one batch's forward pass of ``ids (B, L)``, ``mask (B, L)`` (1 = real token); its texts are
        numbered from ``first_text``."""
        z: dict[int, Tensor] = {}
        final: list[Tensor] = []

        def keep_heads(layer):
            def fn(t):
                z[layer] = t.detach().float()
                return None

            return fn

        def keep_final(t):
            final.append(t.detach().float())
            return None

        fns = [(layer_point(i, "attn.heads"), keep_heads(i)) for i in range(self.hm.num_layers)]
        with self.hm.hooks([*fns, ("resid_final", keep_final)]):
            yield
        if len(z) != self.hm.num_layers or not final:
            raise RuntimeError("the pass did not reach every layer's heads and the final residual stream")
        with torch.no_grad():
            self._add(
                torch.as_tensor(np.asarray(ids)), torch.as_tensor(np.asarray(mask)).bool(), first_text, z, final[-1]
            )

    # -- one batch ---------------------------------------------------------------------------------------------
    def _unembedding(self) -> tuple[Tensor, Tensor | None]:
        from headwise.models.anatomy import affine

        got = affine(self.anatomy.unembed)
        if got is None:
            raise self.anatomy.refuse("its written tokens (an unembedding that is not a linear layer)")
        W, b = got
        return W.detach().float(), None if b is None else b.detach().float()

    def _logits(self, y: Tensor, W: Tensor, b: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """``y (n, D)`` the final norm's output -> the model's logits ``(n, V)`` and the soft-cap's derivative."""
        raw = y @ W.T  # the bias and the scale in place: no second (n, V) tensor
        if b is not None:
            raw += b
        if self.anatomy.logit_scale != 1:
            raw *= self.anatomy.logit_scale
        cap = self.anatomy.softcap
        if cap is None:
            return raw, None
        t = torch.tanh(raw / cap)
        return cap * t, 1 - t * t

    def _add(self, ids: Tensor, mask: Tensor, first_text: int, z: dict, x: Tensor) -> None:
        hm, anatomy = self.hm, self.anatomy
        B, L = mask.shape
        n = mask.sum(1)
        rows = x[mask]  # (N, D) the final norm's input at the real tokens
        N = rows.shape[0]
        with hm.holding(*[m for m in (anatomy.final_norm, anatomy.unembed) if m is not None]):
            frozen = anatomy.final_norm_frozen(rows)
            lin = _float32(frozen)  # float32 parts through the frozen norm (its scale read in float64)
            y = lin(rows) + (0 if frozen is None else frozen.bias.float())  # (N, D)
            W, b = self._unembedding()
            # the predicted rows: every real token but each text's last, with the next token as its target
            nxt = torch.zeros_like(mask)
            nxt[:, :-1] = mask[:, 1:]
            pred_mask = (mask & nxt)[mask]  # (N,)
            targets = ids[:, 1:][mask[:, :-1] & mask[:, 1:]]  # (M,)
            pred = pred_mask.nonzero().squeeze(1)
            M = pred.shape[0]
            at = self.predicted + torch.arange(M)  # (M,) the corpus's predicted-token index
            take = min(self.exact_tokens - self.sampled, M)
            sampled = (at % self.stride == 0) | (at < self.predicted + max(take, 0))  # the sample and the exact check
            sel = pred[sampled]
            g = torch.zeros(sel.shape[0], W.shape[1])  # (m, D)  U^T (e_y − p) at the selected tokens
            sel_targets = targets[sampled]
            chunk = max(1, _LOGIT_ELEMENTS // W.shape[0])
            for s in range(0, sel.shape[0], chunk):
                rows_s = sel[s : s + chunk]
                logits, slope = self._logits(y[rows_s], W, b)
                p = torch.softmax(logits, -1)  # (c, V), then in place: the logits' memory alone beside it
                del logits
                p[torch.arange(rows_s.shape[0]), sel_targets[s : s + chunk]] -= 1.0
                p.mul_(-self.anatomy.logit_scale)  # e_y − p, times the logit scale
                if slope is not None:
                    p.mul_(slope)
                g[s : s + chunk] = p @ W
            keep = (at[sampled] % self.stride == 0).nonzero().squeeze(1)  # among the selected: the loss sample
            first = torch.arange(max(take, 0))  # the exact check's tokens lead the selected ones
            sample = pred[: max(take, 0)]
            xs = rows[sample].double()
            base = self._loss(xs, targets[:take], W, b) if take > 0 else None  # the intact rows' loss, once a batch
        positions = torch.arange(L).expand(B, L)[mask]  # (N,)
        texts = (torch.arange(B)[:, None].expand(B, L) + first_text)[mask]  # (N,)
        b_of = torch.arange(B)[:, None].expand(B, L)[mask]
        ids_np, n_np = ids.numpy(), n.numpy()
        effects = torch.full((keep.shape[0], *self.sums.shape[:2]), float("nan"))  # (m, NL, H)
        for layer, part in enumerate(anatomy.layers):
            H = self.heads[layer]
            with hm.holding(layer):
                w = part.head_writes(z[layer])  # (B, H, L, D)
                w = w.permute(0, 2, 1, 3)[mask]  # (N, H, D)
                post = None
                if part.attn_post is not None:
                    from headwise.models.anatomy import affine

                    _, ob = affine(part.out_proj)
                    o = w.sum(1) + (0 if ob is None else ob.detach().float())
                    post = part.attn_post_frozen(o)
            if post is not None:
                w = _float32(post)(w)
            w = w * part.scale
            u = lin(w)  # (N, H, D) through the frozen final norm
            self.sums[layer, :H] += u.sum(0, dtype=torch.float64)
            if sel.numel():
                each = torch.einsum("mhd,md->mh", u[sel], g)  # (m, H) every selected token's first-order effect
                effects[:, layer, :H] = each[keep]
            if take > 0:
                self.estimate[layer, :H] += each[first].sum(0, dtype=torch.float64)
                self.exact[layer, :H] += self._exact(xs, w[sample].double(), targets[:take], W, b, base)
            self._keep_top(layer, w.norm(dim=-1), texts, positions, b_of, ids_np, n_np)
        self.kept_at.append(at[sampled][keep])
        self.kept.append(effects)
        self.tokens += N
        self.predicted += M
        self.sampled += max(take, 0)
        self.seen += B
        self._thin(self.seen == B)

    def _thin(self, first: bool) -> None:
        """Past the budget: the stride doubled and the tokens off it dropped, until the sample fits; after the
        ``first`` batch of a corpus of known length, doubled until the corpus's expected tokens fit."""
        if first and self.texts:
            expected = self.predicted / self.seen * max(self.texts, self.seen)
            while expected / self.stride > self.budget:
                self.stride *= 2
        while True:
            if self.stride > 1:
                on = [a % self.stride == 0 for a in self.kept_at]
                self.kept_at = [a[o] for a, o in zip(self.kept_at, on)]
                self.kept = [e[o] for e, o in zip(self.kept, on)]
            if sum(int(a.shape[0]) for a in self.kept_at) <= self.budget:
                return
            self.stride *= 2

    def _loss(self, xs: Tensor, targets: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
        """``xs (…, m, D)`` final residual rows -> ``(…,)`` their summed next-token cross-entropy on ``targets (m,)``
        (the final norm recomputed, the log-softmax in float64)."""
        anatomy = self.anatomy
        y = xs.float() if anatomy.final_norm is None else anatomy.final_norm(xs.float())
        logits, _ = self._logits(y.reshape(-1, y.shape[-1]), W, b)
        logits = logits.double().reshape(*xs.shape[:-1], -1)
        lp = torch.log_softmax(logits, -1)
        return -lp.gather(-1, targets.expand(*xs.shape[:-1]).unsqueeze(-1)).squeeze(-1).sum(-1)

    def _exact(self, x: Tensor, w: Tensor, targets: Tensor, W: Tensor, b: Tensor | None, base: Tensor) -> Tensor:
        """``(H,)`` the exact change of the summed next-token loss over ``x (m, D)`` when each head's write ``w (m, H,
        D)`` leaves the final residual stream (the final norm recomputed); ``base``: the intact rows' loss."""
        return self._loss(x[None] - w.permute(1, 0, 2), targets, W, b) - base

    def _keep_top(self, layer, norms: Tensor, texts, positions, b_of, ids_np, n_np) -> None:
        """Merge this batch's largest writes ``norms (N, H)`` into each head's kept ``k``."""
        k = min(self.top_k, norms.shape[0])
        if k == 0:
            return
        vals, idx = torch.topk(norms.T, k, dim=1)  # (H, k)
        for h in range(norms.shape[1]):
            merged = [(float(self.best[layer, h, j]), self.where[layer][h][j]) for j in range(self.top_k)]
            for v, i in zip(vals[h].tolist(), idx[h].tolist()):
                bi, pos = int(b_of[i]), int(positions[i])
                merged.append((v, (int(texts[i]), pos, *_snippet(ids_np[bi], pos, int(n_np[bi]), self.context))))
            merged = [m for m in merged if m[1] is not None]
            merged.sort(key=lambda m: (-m[0], m[1][0], m[1][1]))
            merged = merged[: self.top_k]
            for j in range(self.top_k):
                self.best[layer, h, j], self.where[layer][h][j] = merged[j] if j < len(merged) else (-1.0, None)

    # -- the end -------------------------------------------------------------------------------------------
    def result(self) -> WrittenTokens:
        """What the batches added up to (:class:`WrittenTokens`)."""
        NL, H = self.sums.shape[:2]
        missing = torch.tensor([[h >= self.heads[i] for h in range(H)] for i in range(NL)])
        nan = float("nan")

        def grid(t: Tensor, count: int) -> np.ndarray:
            out = (t / max(count, 1)).clone()
            out[missing] = nan
            return out.numpy()

        mean = (self.sums / max(self.tokens, 1)).clone()
        mean[missing] = nan
        top = [
            [[(float(self.best[i, h, j]), *self.where[i][h][j]) for j in range(self.top_k) if self.where[i][h][j]]
             for h in range(H)]
            for i in range(NL)
        ]  # fmt: skip
        effects = torch.cat(self.kept).double() if self.kept else torch.zeros(0, NL, H, dtype=torch.float64)
        m = effects.shape[0]
        spread = effects.std(0, unbiased=True) / m**0.5 if m > 1 else torch.full((NL, H), nan, dtype=torch.float64)
        return WrittenTokens(
            mean_write=mean.numpy(),
            loss_effect=grid(effects.sum(0), m),
            loss_stderr=spread.masked_fill(missing, nan).numpy(),
            loss_tokens=m,
            stride=self.stride,
            exact_sample=grid(self.exact, self.sampled),
            estimate_sample=grid(self.estimate, self.sampled),
            sampled=self.sampled,
            tokens=self.tokens,
            predicted=self.predicted,
            top=top,
        )

    def written(self, found: WrittenTokens, k: int = 8) -> list[list[tuple[list, list]]]:
        """``[layer][head]`` ``(raises, lowers)``: the ``k`` token ids whose logit the mean write raises most and
        lowers most, with the values, ``[(id, value)]`` — the unembedding applied to each head's mean write (times
        the logit scale)."""
        hm = self.hm
        with hm.holding(self.anatomy.unembed):
            W, _ = self._unembedding()
        out = []
        for layer in range(found.mean_write.shape[0]):
            m = torch.from_numpy(np.nan_to_num(found.mean_write[layer])).float()  # (H, D)
            logits = (m @ W.T) * self.anatomy.logit_scale  # (H, V)
            hi, hi_i = torch.topk(logits, k, dim=1)
            lo, lo_i = torch.topk(-logits, k, dim=1)
            out.append(
                [
                    (list(zip(hi_i[h].tolist(), hi[h].tolist())), list(zip(lo_i[h].tolist(), (-lo[h]).tolist())))
                    for h in range(self.heads[layer])
                ]
            )
        return out


def ov_mappings(hm, sources: Tensor, targets: Tensor, *, k: int = 6) -> list[list[dict]]:
    """Every head's OV circuit read on tokens: ``sources (F,)`` token ids embedded (the model's embedding module,
    scaled as the model scales it), through the layer's input norm, the head's key/value group's values and its rows
    of ``W_O``, the final norm's gain (its scale set to 1, as :mod:`headwise.circuits.composition` folds norms) and
    the unembedding's rows ``targets (T,)``; each target's score taken against its mean over the sources (a token
    every source raises — a row of the unembedding of large norm — is no mapping of one source).

    Returns:
        ``[layer][head]``: ``{"copying": share of sources whose strongest target is themselves (among sources in
        targets), "top": [(source id, target id, value)] the k sources with the strongest mapping, each with its
        strongest target}``.
    """
    from headwise.models.anatomy import affine
    from headwise.models.anatomy_probe import input_embedding

    anatomy = hm.anatomy
    embed = anatomy.embed if anatomy.embed is not None else input_embedding(hm.model)
    if embed is None or anatomy.unembed is None or affine(anatomy.unembed) is None:
        raise anatomy.refuse("its OV circuit's tokens (no token embedding and linear unembedding to read)")
    with hm.holding(*[m for m in (embed, anatomy.final_norm, anatomy.unembed) if m is not None]), torch.no_grad():
        e = embed(sources[None])[0].float()  # (F, D)
        U = affine(anatomy.unembed)[0].detach().float()[targets]  # (T, D)
        if anatomy.final_norm is not None:
            frozen = anatomy.final_norm_frozen(e)
            gain = frozen.gain.float()
            U = U * gain
            if frozen.centred:
                U = U - U.mean(-1, keepdim=True)
    in_targets = (sources[:, None] == targets[None]).any(1)  # (F,)
    self_col = torch.full((sources.shape[0],), -1)
    hit = (sources[:, None] == targets[None]).nonzero()
    self_col[hit[:, 0]] = hit[:, 1]
    out = []
    for layer, part in enumerate(anatomy.layers):
        with hm.holding(layer), torch.no_grad():
            x = part.attn_input(e)  # (F, D)
            Wv, bv = part.v.weights("heads")  # (n, Dv, D), (n, Dv)
            v = torch.einsum("fd,gvd->fgv", x, Wv.detach().float())
            if bv is not None:
                v = v + bv.detach().float()
            Wo = part.heads_out().detach().float()  # (H, Dv, D)
        H, G = Wo.shape[0], v.shape[1]
        row = []
        for h in range(H):
            write = v[:, h * G // H] @ Wo[h] * part.scale  # (F, D)
            scores = write @ U.T  # (F, T)
            scores = scores - scores.mean(0, keepdim=True)  # each target against its mean over the sources
            value, best = scores.max(1)  # (F,) each source's strongest target
            copying = (
                float((best[in_targets] == self_col[in_targets]).float().mean()) if bool(in_targets.any()) else None
            )
            order = value.argsort(descending=True)[:k]
            row.append(
                {
                    "copying": copying,
                    "top": [(int(sources[i]), int(targets[best[i]]), float(value[i])) for i in order.tolist()],
                }
            )
        out.append(row)
    return out
