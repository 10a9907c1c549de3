"""Attention-aware attribution (AtP*, Kramár et al. 2024): the change of a head's attention pattern computed
exactly for a changed query or key, linear from the pattern onwards.

Shape legend: N rows (P prompt pairs), L length, S keys, D model width, H query heads, Hkv key/value groups,
G = H / Hkv, Dh head width, Dv value width, n senders of one group, R receivers.

EAP's first-order estimate goes through the softmax: where a head's attention is saturated (an induction head
sure of its key) the gradient with respect to a key is near zero, while replacing the key moves the attention
elsewhere entirely. AtP*'s fix: for a change ``Δ (N, L, D)`` of the residual that a query or key receiver reads,
recompute the receiving head's pattern exactly and linearise only after it::

    q'_h = rot(qknorm(W_Q[h] · norm(r + Δ)))            (the clean keys; GQA: head h reads group g(h))
    A'_h = softmax(scale · q'_h k_g^T, masks, soft-cap, sinks as the model's)
    score = Σ_{t, s} ∂m/∂A_h[t, s] · (A'_h − A_h)[t, s]                        (mean over pairs)

and for a key/value group's keys ``k'_g = rot(qknorm(W_K[g] · norm(r + Δ)))`` with every query head of the group
recomputed on them — the group's score the sum of its heads' terms, each a **share** (MIB counts a group's keys
per query head). The gradient with respect to the pattern is exact where the head's output is ``z_h = A_h V_g``:
``∂m/∂A_h = ∂m/∂z_h · V_g^T`` from the clean run's backward pass (checked: ``A_h V_g`` must equal the head's
output, or the layer is refused). Value, MLP and logit receivers keep EAP's gradient (linear in the pattern's
inputs already). Everything is read from the model's anatomy (:mod:`headwise.models.anatomy`): the input norm,
the sides' columns, QK-norms and scales, the rotation, at the named points ``layers.{l}.resid_pre``,
``attn.qk``, ``attn.v``, ``attn.rotary``, ``attn.heads``; the recomputed queries and keys are checked against
the model's own at Δ = 0.

:class:`AttentionTaps` records a clean gradient pass's per-layer parts; :class:`LayerPatterns` recomputes one
layer's patterns and scores changes; :func:`atp_scores` fills the q/k columns of edge scores;
:func:`head_use_gradients` splits a key or value group's input gradient into its query heads' shares.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from headwise.circuits.addresses import Receiver
from headwise.core.rows import AttentionRows
from headwise.models.anatomy import same
from headwise.points import layer_point

__all__ = [
    "CHUNK_BYTES",
    "AttentionTaps",
    "LayerPatterns",
    "LowRank",
    "atp_scores",
    "head_use_gradients",
    "sender_bytes",
]

#: elements of the transient ``(N, n, L, D)`` inputs / ``(N·n, H, L, S)`` patterns of n senders taken at once
_CHUNK_ELEMENTS = 1 << 24
#: bytes of every transient of one chunk of senders together (:func:`sender_bytes` each; at least one sender a chunk)
CHUNK_BYTES = 128 * 2**20


def sender_bytes(rows: int, length: int, width: int, heads: int, groups: int, head_width: int) -> int:
    """Bytes :meth:`LayerPatterns.scores` holds at once for one sender's change over ``rows`` rows of ``length``
    positions of a layer of model width ``width``, ``heads`` query heads, ``groups`` key/value groups of
    ``head_width``, float32, an upper bound: the changed input and its norm ``(L, D)`` twice, the projected columns
    and the post-rotary queries and keys with the rotation's temporaries (four times ``(H + Hkv)·Dh``), and the
    recomputed patterns with the softmax's temporaries (three ``(H, L, L)``) — measured on SmolLM2 about half of it."""
    columns = (heads + groups) * head_width
    return 4 * rows * length * (2 * width + 4 * columns + 3 * heads * length)


@dataclass(eq=False)
class _LayerRecord:
    r: Tensor | None = None  # (N, L, D): the block's input
    rows: AttentionRows | None = None
    v: Tensor | None = None  # (N, L, Hkv, Dv): the values as projected
    z: Tensor | None = None  # (N, H, L, Dv)
    gz: Tensor | None = None  # (N, H, L, Dv): ∂m/∂z from the backward pass
    pe: tuple | None = None


@dataclass(eq=False)
class _NormedColumns:
    """A layer's input norm at the clean run as ``C(x)·g·(ms(C(x)) + ε)^-1/2 + b`` (``eps`` None: no norm), with
    the query and key columns ``Wg = diag(g) W`` ``(D, C)``, ``cb = b W + bias`` ``(C,)``, the clean rows ``cr =
    C(r)`` ``(N, L, D)``, their columns ``base = cr Wg`` and ``ms = ms(cr)`` ``(N, L)`` float64; ``checked`` /
    ``failed``: the one check against the dense route."""

    centred: bool
    eps: float | None
    Wg: Tensor
    cb: Tensor
    cr: Tensor
    base: Tensor
    ms: Tensor
    checked: bool = False
    failed: bool = False


@dataclass(eq=False)
class LowRank:
    """Senders' changes given by factors: sender i's change at row n, position t is ``coef[n, i, t] @ basis[i]``.

    Attributes:
        coef: ``(N, n, L, k)`` (a head's output change ``Δz_h``); basis: ``(n, k, D)`` (its rows of ``W_O`` times the
        layer's multiplier). A head's write has rank Dv: its queries' and keys' columns are ``Δz_h (W_O[h] W^T)``,
        Dv instead of D products per position and column.
    """

    coef: Tensor
    basis: Tensor

    @property
    def shape(self) -> tuple[int, int, int, int]:
        N, n, L, _ = self.coef.shape
        return N, n, L, self.basis.shape[-1]

    def part(self, start: int, stop: int, first: int) -> LowRank:
        """Senders ``start … stop − 1`` at positions ``first …``."""
        return LowRank(self.coef[:, start:stop, first:], self.basis[start:stop])

    def dense(self) -> Tensor:
        """``(N, n, L, D)``."""
        return torch.einsum("xilk,ikd->xild", self.coef, self.basis.to(self.coef.dtype))

    def changed(self) -> Tensor:
        """``(L,)`` bool: the positions any change reaches."""
        return self.coef.ne(0).any(-1).any(1).any(0)


class AttentionTaps:
    """Hooks that record, in one clean forward-and-backward pass, what the attention-aware scores need at each
    layer: the block's input, the attention's rows (post-rotary q and k with the call), the values, the heads'
    outputs and their gradient. Pass :meth:`hooks` as ``extra`` to
    :meth:`~headwise.circuits.wiring.Wiring.receiver_gradients`, then read :meth:`layer`."""

    def __init__(self, w):
        self.w = w
        self.records = [_LayerRecord() for _ in w.layers]

    def hooks(self) -> list:
        hooks = []
        anatomy = self.w.target.anatomy
        for layer, rec in enumerate(self.records):
            hooks.append((layer_point(layer, "resid_pre"), partial(self._keep, rec, "r")))
            hooks.append((layer_point(layer, "attn.qk"), partial(self._keep_rows, rec)))
            hooks.append((layer_point(layer, "attn.v"), partial(self._keep, rec, "v")))
            hooks.append((layer_point(layer, "attn.heads"), partial(self._tap_heads, rec)))
            if anatomy[layer].rotation.kind == "tables":
                hooks.append((layer_point(layer, "attn.rotary"), partial(self._keep_pe, rec)))
        return hooks

    @staticmethod
    def _keep(rec: _LayerRecord, name: str, x: Tensor) -> None:
        setattr(rec, name, x.detach())

    @staticmethod
    def _keep_rows(rec: _LayerRecord, rows: AttentionRows) -> None:
        rec.rows = AttentionRows(rows.q.detach(), rows.k.detach(), rows.call)

    @staticmethod
    def _keep_pe(rec: _LayerRecord, pe) -> None:
        rec.pe = tuple(x.detach() for x in pe)

    @staticmethod
    def _tap_heads(rec: _LayerRecord, z: Tensor) -> None:
        rec.z = z.detach()
        if z.requires_grad:
            z.register_hook(partial(AttentionTaps._keep_grad, rec))

    @staticmethod
    def _keep_grad(rec: _LayerRecord, g: Tensor) -> None:
        rec.gz = g.detach() if rec.gz is None else rec.gz + g.detach()

    def layer(self, layer: int) -> LayerPatterns:
        """The :class:`LayerPatterns` of ``layer`` (after the pass)."""
        return LayerPatterns(self.w, layer, self.records[layer])


class LayerPatterns:
    """One layer's clean attention, and its patterns recomputed for changes of what its queries and keys read.

    Attributes:
        A: ``(N, H, L, S)`` the clean weights; GA: ``(N, H, L, S)`` ``∂m/∂A`` (``∂m/∂z_h · V_g^T``).
    Raises:
        AnatomyError (a ValueError): the layer's parts do not reproduce its queries, keys or outputs.
    """

    def __init__(self, w, layer: int, rec: _LayerRecord):
        self.w, self.layer, self.rec = w, layer, rec
        self.part = w.layers[layer]
        missing = [n for n in ("r", "rows", "v", "z") if getattr(rec, n) is None]
        if missing:
            raise RuntimeError(f"circuits: layer {layer}'s {missing} were not recorded in the gradient pass")
        rows = rec.rows
        N, H, L, Dh = rows.q.shape
        self.N, self.H, self.L = N, H, L
        self.Hkv = rows.k.shape[1]
        self.pos = torch.arange(L, device=rows.q.device)
        with torch.no_grad():
            self.A = rows.weights(0, L, keys=rows.k.shape[-2]).float()  # (N, H, L, S)
            v = self.part.v.apply_norm(rec.v)
            v = (v * self.part.v.scale).transpose(1, 2).float()  # (N, Hkv, S, Dv)
            self.V = v.repeat_interleave(H // self.Hkv, 1)  # (N, H, S, Dv)
            z = torch.einsum("nhls,nhsd->nhld", self.A, self.V)
            if not same(z, rec.z.float()):
                raise self._refuse("its heads' outputs are not their patterns times their values")
            gz = rec.gz if rec.gz is not None else torch.zeros_like(rec.z)
            self.GA = torch.einsum("nhld,nhsd->nhls", gz.float(), self.V)  # (N, H, L, S)
            zero = rec.r.new_zeros(N, 1, L, rec.r.shape[-1])
            q0, k0 = self.sides(zero)
            if not (same(q0[:, 0], rows.q.float()) and same(k0[:, 0], rows.k[:, :, :L].float())):
                raise self._refuse("its queries and keys are not recomputed from its parts")

    def _refuse(self, what: str):
        return self.w.target.anatomy.refuse(f"layer {self.layer}: {what}")

    def _qk_weights(self) -> tuple[Tensor, Tensor | None]:
        """``(W (D, (H + Hkv)·Dh), b or None)``: the anatomy's query and key sides in the ``"columns"`` layout side by
        side (both sides in one product), read once."""
        if not hasattr(self, "_qk"):
            (Wq, bq), (Wk, bk) = (self.part.sides[name].weights("columns") for name in ("q", "k"))
            b = None
            if bq is not None or bk is not None:
                b = torch.cat([torch.zeros(W.shape[1]) if c is None else c for W, c in ((Wq, bq), (Wk, bk))])
            self._qk = (torch.cat([Wq, Wk], 1).contiguous(), b)
        return self._qk

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``x (N, n, L', D)`` normalised -> the projections' columns ``(N, n, L', H·Dh)`` and ``(N, n, L', Hkv·Dh)``
        (before any QK-norm): both sides in one product."""
        W, b = self._qk_weights()
        N, n, L, D = x.shape
        y = x.reshape(-1, D) @ W.to(x.dtype)
        if b is not None:
            y = y + b.to(y)
        y = y.reshape(N, n, L, -1)
        Hq = self.H * self.part.q.width
        return y[..., :Hq], y[..., Hq:]

    def _finish(self, name: str, y: Tensor, m: int, first: int) -> Tensor:
        """One side's columns ``y (N, n, L', m·Dh)`` at positions ``first …`` -> ``(N, n, m, L', Dh)``: QK-norm,
        scale, rotation."""
        side = self.part.sides[name]
        N, n, L, _ = y.shape
        y = y.reshape(N, n, L, m, -1)
        y = side.apply_norm(y)
        if side.scale != 1.0:
            y = y * side.scale
        t = y.permute(0, 1, 3, 2, 4)  # (N, n, m, L, Dh)
        if self.part.rotation.kind == "none":
            return t.float()
        Dh = t.shape[-1]
        t = self.part.rotation(t.reshape(N * n * m, L, Dh), self.pos[first:], self.rec.pe)
        return t.reshape(N, n, m, L, Dh).float()

    def sides(self, delta: Tensor, first: int = 0) -> tuple[Tensor, Tensor]:
        """``delta (N, n, L', D)`` added to the residual the layer reads at positions ``first … L − 1`` -> the
        post-rotary queries ``(N, n, H, L', Dh)`` and keys ``(N, n, Hkv, L', Dh)`` there (exact: the input norm at
        ``r + Δ``)."""
        yq, yk = self.columns(delta, first)
        return self._finish("q", yq, self.H, first), self._finish("k", yk, self.Hkv, first)

    def columns(self, delta, first: int = 0) -> tuple[Tensor, Tensor]:
        """The projections' columns (before any QK-norm) for ``delta (N, n, L', D)`` (or :class:`LowRank` factors)
        at positions ``first …``: ``(N, n, L', H·Dh)`` and ``(N, n, L', Hkv·Dh)``."""
        if isinstance(delta, LowRank):
            return self._columns_low_rank(delta, first)
        r = self.rec.r[:, first:]
        x = self.part.attn_input(r[:, None] + delta.to(r.dtype))  # (N, n, L', D)
        return self._project(x)

    def _norm_form(self) -> _NormedColumns | None:
        """The input norm as ``C(x)·g·inv(x) + b``, ``inv(x) = (ms(C(x)) + ε)^-1/2`` (a LayerNorm or an RMS norm; the
        identity: no norm), frozen at this run by the anatomy (:meth:`LayerAnatomy.attn_norm_frozen`, one ε fitted
        to its rows), with the clean run's projected columns; None where the norm is not of that form."""
        if hasattr(self, "_form"):
            return self._form
        self._form = None
        W, b = self._qk_weights()  # (D, C), (C,) or None
        W = W.float()
        b = torch.zeros(W.shape[1]) if b is None else b.float()
        r = self.rec.r.float()
        N, L, D = r.shape
        gain, bias, centred, eps = torch.ones(D), torch.zeros(D), False, None
        if self.part.attn_norm is not None:
            try:
                frozen = self.part.attn_norm_frozen(self.rec.r.reshape(-1, D))
            except ValueError:
                return None
            eps = frozen.epsilon(r.reshape(-1, D))
            if eps is None:
                return None
            gain, bias, centred = frozen.gain.float(), frozen.bias.float(), frozen.centred
        cr = r - r.mean(-1, keepdim=True) if centred else r  # (N, L, D)
        Wg = gain[:, None] * W  # (D, C): the gain folded into the columns
        self._form = _NormedColumns(centred, eps, Wg, bias @ W + b, cr, cr @ Wg, cr.double().pow(2).mean(-1))
        return self._form

    def _columns_low_rank(self, change: LowRank, first: int) -> tuple[Tensor, Tensor]:
        """:meth:`columns` of factored changes: ``W(C(r + Δ))·g·inv + b`` with ``W C(Δ) = coef · (C(basis) W)`` and
        ``ms(C(r + Δ)) = ms(C(r)) + (2 C(r)·C(Δ) + |C(Δ)|²)/D`` from the factors (each position's norm exact).
        Checked once per layer against the dense route (one sender); the dense route where they differ or the norm
        is of no such form."""
        form = self._norm_form()
        N, n, rows_per, k = change.coef.shape
        D, C = change.basis.shape[-1], self._qk_weights()[0].shape[1]
        rows = N * rows_per
        # the factors pay k·D·C per sender for their product with the columns: worth it over many rows only
        if form is None or form.failed or k * D * C + rows * k * (C + D) >= rows * D * C:
            return self.columns(change.dense(), first)
        B = change.basis.float()  # (n, k, D)
        if form.centred:
            B = B - B.mean(-1, keepdim=True)
        coef = change.coef.float()  # (N, n, L', k)
        M = torch.einsum("ikd,dc->ikc", B, form.Wg)  # (n, k, C)
        proj = torch.einsum("xilk,ikc->xilc", coef, M).add_(form.base[:, None, first:])  # (N, n, L', C)
        if form.eps is not None:
            cross = (coef * torch.einsum("xld,ikd->xilk", form.cr[:, first:], B)).sum(-1)  # (N, n, L')
            quad = torch.einsum("xilk,ikj,xilj->xil", coef, B @ B.transpose(1, 2), coef)
            ms = form.ms[:, None, first:] + (2 * cross.double() + quad.double()) / D
            proj.mul_((ms + form.eps).rsqrt().float()[..., None])
        cols = proj.add_(form.cb)
        Hq = self.H * self.part.q.width
        yq, yk = cols[..., :Hq], cols[..., Hq:]
        if not form.checked:
            form.checked = True
            dq, dk = self.columns(change.part(0, 1, 0).dense(), first)
            if not (same(yq[:, :1], dq) and same(yk[:, :1], dk)):
                form.failed = True
                return self.columns(change.dense(), first)
        return yq, yk

    def _wide(self, name: str) -> bool:
        """Whether the side's QK-norm spans the whole projection (OLMo 2): one receiver's change moves the others."""
        side = self.part.sides[name]
        return side.norm is not None and not side.norm_per_head

    def _one_receiver(self, name: str, y: Tensor, clean: Tensor, m: int, first: int, j: int) -> Tensor:
        """``(N, n, m, L', Dh)`` the side post-rotary with receiver ``j``'s columns from ``y (N, n, L', m·Dh)`` and
        every other receiver's from ``clean (N, 1, L', m·Dh)``: under a norm over the whole projection the other
        receivers move too, as the model moves them."""
        Dh = y.shape[-1] // m
        mixed = clean.expand_as(y).clone()
        mixed[..., j * Dh : (j + 1) * Dh] = y[..., j * Dh : (j + 1) * Dh]
        return self._finish(name, mixed, m, first)

    def _weights(self, q: Tensor, k: Tensor, n: int, start: int) -> Tensor:
        """The patterns of query rows ``start … L − 1`` given as ``q (N·n, H, L − start, Dh)`` over
        ``k (N·n, Hkv, S, Dh)`` with the layer's call (its masks' rows from ``start``, tiled over the n copies of
        each row) -> ``(N, n, H, L − start, S)``."""
        call = self.rec.rows.call
        changes: dict = {"q_offset": call.q_offset + start}
        for name in ("blocked", "bias"):
            t = getattr(call, name)
            if isinstance(t, Tensor):
                if t.dim() >= 2 and t.shape[-2] != 1:
                    t = t[..., start:, :]
                if t.dim() == 4 and t.shape[0] == self.N and self.N > 1:
                    t = t.repeat_interleave(n, 0)
                changes[name] = t
        rows = AttentionRows(q, k, call.replace(**changes))
        w = rows.weights(0, self.L - start, keys=k.shape[-2]).float()
        return w.reshape(self.N, n, self.H, self.L - start, -1)

    def chunk(self, n: int) -> int:
        """How many of ``n`` senders' changes are taken at once (their inputs, projections and patterns): their
        transients together within :data:`CHUNK_BYTES` (:func:`sender_bytes`), none over :data:`_CHUNK_ELEMENTS`."""
        D = self.rec.r.shape[-1]
        per = self.N * self.L * max(D, self.H * self.L)
        dh = self.rec.rows.q.shape[-1]
        each = sender_bytes(self.N, self.L, D, self.H, self.Hkv, dh)
        return max(1, min(n, _CHUNK_ELEMENTS // max(1, per), CHUNK_BYTES // max(1, each)))

    def scores(
        self, delta: Tensor, *, queries: bool = True, keys: bool = True, both: bool = False, first: int | None = None
    ) -> dict:
        """The attention-aware terms of the changes ``delta (N, n, L, D)`` (one per sender; or
        :class:`LowRank` factors):
        ``{"q": (N, n, H), "k": (N, n, H)}`` — head h's ``Σ ∂m/∂A_h · (A'_h − A_h)`` with the change in its
        queries alone (the clean keys) or in its group's keys alone (the clean queries; a group's score is the sum
        over its heads), and with ``both``: ``"qk"`` the change in queries and keys at once.

        Positions where every change is exactly zero (before the first token a corrupted prompt changes, in a
        causal model) keep their clean queries and keys: only the positions from the first changed one are
        projected, and only the query rows that can see a changed key are recomputed. ``first``: the first
        position where any change is nonzero, when the caller knows it (found here otherwise)."""
        rows = self.rec.rows
        N, n = delta.shape[:2]
        D = delta.shape[-1]
        if first is None:
            reach = delta.changed() if isinstance(delta, LowRank) else delta.ne(0).any(-1).any(1).any(0)
            changed = reach.nonzero()  # positions any change reaches
            first = int(changed[0, 0]) if changed.numel() else self.L
        if first >= self.L:
            zeros = torch.zeros(N, n, self.H)
            return {name: zeros for name, on in (("q", queries), ("k", keys), ("qk", both)) if on}
        call = rows.call
        # rows before `first` see no changed key when the call is causal over keys in slot order
        k_rows = first if call.is_causal and call.key_slots is None and call.q_offset == 0 else 0
        out: dict = {}
        step = self.chunk(n)
        q0, k0 = rows.q.float(), rows.k[:, :, : self.L].float()
        wide = {name: self._wide(name) for name in ("q", "k")}
        if (queries and wide["q"]) or (keys and wide["k"]):
            clean = self.columns(self.rec.r.new_zeros(N, 1, self.L - first, D), first)
        for start in range(0, n, step):
            if isinstance(delta, LowRank):
                d = delta.part(start, start + step, first)
            else:
                d = delta[:, start : start + step, first:]
            m = d.shape[1]
            yq, yk = self.columns(d, first)
            q1 = self._finish("q", yq, self.H, first).reshape(N * m, self.H, self.L - first, -1)
            k1 = self._finish("k", yk, self.Hkv, first).reshape(N * m, self.Hkv, self.L - first, -1)
            k0m = k0.repeat_interleave(m, 0) if queries or first > 0 else None
            q0m = q0[:, :, k_rows:].repeat_interleave(m, 0) if keys else None

            def keys_with(k_new, k0m=k0m, m=m):
                k_new = k_new.reshape(N * m, self.Hkv, self.L - first, -1)
                return k_new if first == 0 else torch.cat([k0m[:, :, :first], k_new], 2)

            def term(q, k, row, m=m):
                dA = self._weights(q, k, m, row).sub_(self.A[:, None, :, row:])  # (N, m, H, L − row, S)
                return dA.mul_(self.GA[:, None, :, row:]).sum((-1, -2))  # (N, m, H)

            if queries and not wide["q"]:
                out.setdefault("q", []).append(term(q1, k0m, first))
            elif queries:  # each receiver alone: every head's pattern moves through the norm, all counted
                parts = [self._one_receiver("q", yq, clean[0], self.H, first, j) for j in range(self.H)]
                out.setdefault("q", []).append(
                    torch.stack(
                        [term(p.reshape(N * m, self.H, self.L - first, -1), k0m, first).sum(-1) for p in parts], -1
                    )
                )
            if keys and not wide["k"]:
                out.setdefault("k", []).append(term(q0m, keys_with(k1), k_rows))
            elif keys:  # group g's keys alone: its own heads' terms, and the others' (moved by the norm) shared
                G = self.H // self.Hkv
                heads = []
                for g in range(self.Hkv):
                    t = term(q0m, keys_with(self._one_receiver("k", yk, clean[1], self.Hkv, first, g)), k_rows)
                    own = t[..., g * G : (g + 1) * G]
                    heads.append(own + (t.sum(-1, keepdim=True) - own.sum(-1, keepdim=True)) / G)
                out.setdefault("k", []).append(torch.cat(heads, -1))
            if both:
                qn = q1 if k_rows == first else torch.cat([q0[:, :, k_rows:first].repeat_interleave(m, 0), q1], 2)
                out.setdefault("qk", []).append(term(qn, keys_with(k1), k_rows))
        return {name: torch.cat(parts, 1) for name, parts in out.items()}


@torch.no_grad()
def atp_scores(
    taps: AttentionTaps, graph, diff: list, full: Tensor, shares: list | None = None, factors: dict | None = None
) -> Tensor:
    """Replace the query and key receivers' columns of EAP's ``full (P, S, R)`` by the attention-aware terms of
    the senders' changes ``diff`` (their groups' parts ``(P, n_u, L, D)`` in sender order). ``factors``: sender group
    → :class:`LowRank` of the same changes (the heads of a layer without a norm on its write), used in their place.
    With ``shares`` (a list of NL ``(P, S, H)`` tensors) each key group's per-query-head terms are written there too.
    Returns ``full``."""
    factors = factors or {}
    keys = list(graph.sender_groups)
    slices = list(graph.sender_groups.values())
    dense = [k for k in keys if k not in factors]
    changes = torch.cat([diff[keys.index(k)] for k in dense], 1)  # (P, S_dense, L, D), stage order
    dense_idx = torch.cat([torch.arange(graph.sender_groups[k].start, graph.sender_groups[k].stop) for k in dense])
    low = [k for k in keys if k in factors]
    low_idx = [torch.arange(sl.start, sl.stop) for k, sl in zip(keys, slices) if k in factors]
    low_idx = torch.cat(low_idx) if low_idx else None
    reach = torch.zeros(len(graph.senders), changes.shape[2], dtype=torch.bool)  # (S, L) where each change is nonzero
    reach[dense_idx] = changes.ne(0).any(-1).any(0)
    for k in low:
        reach[graph.sender_groups[k]] = factors[k].coef.ne(0).any(-1).any(0)
    for layer in range(graph.num_layers):
        with taps.w.target.holding(layer):  # the layer's weights in (a model opened layer by layer)
            lp = taps.layer(layer)
            sq, sk = graph.groups[Receiver("q", layer)], graph.groups[Receiver("k", layer)]
            upstream = int(graph.reaches[:, sq.start].sum())  # the senders before this layer reads
            where = reach[:upstream].any(0).nonzero()
            first = int(where[0, 0]) if where.numel() else lp.L
            parts = []
            n_dense = int((dense_idx < upstream).sum())
            if n_dense:
                parts.append((dense_idx[:n_dense], changes[:, :n_dense].to(lp.rec.r.dtype)))
            ups = [k for k in low if graph.sender_groups[k].start < upstream]
            if ups:
                given = LowRank(
                    torch.cat([factors[k].coef for k in ups], 1), torch.cat([factors[k].basis for k in ups])
                )
                parts.append((low_idx[: given.coef.shape[1]], given))
            for idx, given in parts:
                t = lp.scores(given, first=first)
                full[:, idx, sq] = t["q"].to(full.dtype)
                k_heads = t["k"].to(full.dtype)  # (P, n, H)
                full[:, idx, sk] = k_heads.reshape(*k_heads.shape[:2], lp.Hkv, lp.H // lp.Hkv).sum(-1)
                if shares is not None:
                    shares[layer][:, idx] = k_heads
    return full


def head_use_gradients(taps: AttentionTaps, layer: int, name: str) -> Tensor:
    """``(N, H, L, D)``: the gradient of the metric with respect to the input of key/value group g(h)'s ``name``
    side (``"k"`` or ``"v"``) through query head h's use of it alone — the group's input gradient split over its
    query heads (they add up to it). Local: the layer's keys or values recomputed from ``r + d_h`` with one
    ``d_h`` per query head, the objective ``Σ_h ∂m/∂z_h · z_h(d_h)`` (exact: ``∂m/∂z`` is the clean run's)."""
    lp = taps.layer(layer)
    rec = lp.rec
    N, H, L = lp.N, lp.H, lp.L
    gz = rec.gz.float() if rec.gz is not None else torch.zeros_like(rec.z).float()
    r = rec.r
    with torch.enable_grad():
        d = r.new_zeros(N, H, L, r.shape[-1]).float().requires_grad_(True)
        x = lp.part.attn_input(r[:, None] + d.to(r.dtype)).float()  # (N, H, L, D)
        y = _per_head_side(lp, name, x)  # (N, L, H, Dh): head h's copy of its group's side
        if name == "v":
            z = torch.einsum("nhls,nhsd->nhld", lp.A, y.transpose(1, 2))
        else:
            k = lp.part.rotation(y.permute(0, 2, 1, 3).reshape(N * H, L, -1), lp.pos, rec.pe).reshape(N, H, L, -1)
            # each query head over its own copy of its group's keys: H key heads, one per query head
            A = AttentionRows(rec.rows.q.float(), k, rec.rows.call).weights(0, L, keys=L).float()
            z = torch.einsum("nhls,nhsd->nhld", A, lp.V)
        (grad,) = torch.autograd.grad((z * gz).sum(), d)
    return grad


def _per_head_side(lp: LayerPatterns, name: str, x: Tensor) -> Tensor:
    """``x (N, H, L, D)`` normalised, one copy per query head -> ``(N, L, H, Dh)``: head h's copy of its group's
    side (projected, QK-normed, scaled; not rotated). A QK-norm over the whole projection (OLMo 2) normalises each
    copy with the other groups' columns at their clean values."""
    side = lp.part.sides[name]
    G = lp.H // lp.Hkv
    W, b = side.weights("heads")  # (Hkv, Dh, D), (Hkv, Dh)
    Wh = W.float().repeat_interleave(G, 0)  # (H, Dh, D)
    y = torch.einsum("nhld,hwd->nlhw", x, Wh)
    if b is not None:
        y = y + b.float().repeat_interleave(G, 0)
    if side.norm is not None and side.norm_per_head:
        y = side.apply_norm(y)
    elif side.norm is not None:
        r = lp.rec.r
        xc = lp.part.attn_input(r).float()  # (N, L, D)
        clean = torch.einsum("nld,gwd->nlgw", xc, W.float())  # (N, L, Hkv, Dh)
        if b is not None:
            clean = clean + b.float()
        heads, groups = torch.arange(lp.H), torch.arange(lp.H) // G
        full = clean[:, :, None].expand(*clean.shape[:2], lp.H, *clean.shape[2:]).clone()  # (N, L, H, Hkv, Dh)
        full[:, :, heads, groups] = y
        full = side.apply_norm(full)
        y = full[:, :, heads, groups]
    return y * side.scale if side.scale != 1.0 else y
