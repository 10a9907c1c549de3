"""The fast paths — beside the maths, never inside it.

Nothing here is needed by the readable path (``backend="math"``: ``nn.Linear`` and
:func:`headwise.core.functional.attention_math` end to end). Each function computes what the readable
path computes, faster or in less memory, and is tested to agree with it (``tests/core/test_fast_paths.py``):

- :func:`linear`: ``F.linear`` through oneDNN's matmul with the bias added in the kernel's epilogue (a
  single row too: a decoded token's projection, where oneDNN reads the weight on every thread and MKL's
  ``addmv`` on one);
- :func:`project`: a module's Q/K/V projections as one product when they share an input;
- :func:`attention_weights`: attention that returns its weights (or applies soft-capping / sinks,
  which ``F.scaled_dot_product_attention`` cannot), a block of scores at a time;
- :func:`attention_one_query`: one decoded token's attention over its cache as two matrix products, the
  grouped heads' queries against their key/value head's entries read once (GQA, MQA), bf16 entries read as
  bf16.

Under ``torch.compile`` each of them steps aside for the plain operation (TorchInductor fuses on its own,
and cannot lower oneDNN's private operator).

Shape legend: B batch, L query length, S key length, H query heads, Hkv key/value heads, Dh head width
(Dv value head width), In / Out a projection's widths.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.autograd.forward_ad as fwad
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as _torch_module

from headwise.core import kernels, masks
from headwise.core.cache import KVCache, SlidingWindowCache
from headwise.core.primitives import repeat_kv, softmax


def _onednn_linear_available() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):  # pragma: no cover - builds without oneDNN
        return False


_ONEDNN_LINEAR = _onednn_linear_available()
_ONEDNN_DTYPES = (torch.float32, torch.bfloat16)

# Fewest tokens (B·S) for which Q/K/V (or K/V) run as one product while autograd records (the stacked
# weight is then concatenated per call, which short inputs do not repay). Without autograd the stacked
# weight is kept, and one product pays at any length — most of all for a decoded token, where it turns
# three matrix-vector products into one.
FUSE_MIN_TOKENS = 1024


def differentiated(*tensors: Tensor | None) -> bool:
    """Whether a derivative is being taken through these tensors: autograd records them (reverse mode), or a
    forward-mode level is open (``torch.autograd.forward_ad.dual_level``) and one of them carries a tangent.
    The fast kernels have no derivative formulas of either kind, so they step aside in both cases."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return True
    return forward_mode(*tensors)


def forward_mode(*tensors: Tensor | None) -> bool:
    """Whether one of these tensors carries a forward-mode tangent (inside ``forward_ad.dual_level``)."""
    if fwad._current_level < 0:  # no dual level open: no tangent can exist
        return False
    return any(t is not None and fwad.unpack_dual(t).tangent is not None for t in tensors)


def _onednn_applies(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """Whether oneDNN's linear gives exactly ``F.linear``'s result here: CPU float32/bf16 plain tensors,
    no gradient recorded, no autocast, not inside ``torch.compile``."""
    if not _ONEDNN_LINEAR or torch.compiler.is_compiling():
        return False
    if type(x) is not Tensor or x.device.type != "cpu" or x.dtype not in _ONEDNN_DTYPES or x.dim() < 2:
        return False
    if weight.dtype != x.dtype or weight.device.type != "cpu" or x.numel() == 0:
        return False
    if bias is not None and bias.dtype != x.dtype:
        return False
    if torch.is_autocast_enabled("cpu"):
        return False
    return not differentiated(x, weight, bias)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``: ``x Wᵀ + b``, ``(..., In) -> (..., Out)``.

    On the CPU in float32 / bfloat16 with no gradient recorded, oneDNN's matmul with the bias added in
    its epilogue (``torch.ops.mkldnn._linear_pointwise``, the operator TorchInductor's CPU path emits)
    instead of ``addmm``, which first copies the bias into the output and, in float32, calls MKL. The
    result equals ``F.linear``'s up to round-off (tested). Everything else is ``F.linear``.
    """
    if _onednn_applies(x, weight, bias):
        if kernels.enabled and kernels.linear_rows_applies(x, weight, bias):
            return kernels.linear_rows(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def _plain(m: nn.Module) -> bool:
    """A plain ``nn.Linear`` holding plain tensors (not a subclass, not DTensor shards), without hooks
    (a module someone hooked — head gates, probes — is called as a module, so that its hooks run)."""
    if type(m) is not nn.Linear or m._forward_pre_hooks or m._forward_hooks:
        return False
    return all(type(p) in (nn.Parameter, Tensor) for p in (m.weight, m.bias) if p is not None)


def call_linear(m: nn.Module, x: Tensor) -> Tensor:
    """``m(x)``: a plain ``nn.Linear`` through :func:`linear` (its ``forward`` is not called), any other
    module (a subclass, DTensor shards, a hooked Linear) called as a module."""
    return linear(x, m.weight, m.bias) if _plain(m) else m(x)


class _FusedWeights:
    """Concatenated ``(weight (ΣOut, In), bias (ΣOut,) or None)`` of several ``nn.Linear``s.

    While no gradient is recorded the concatenation is kept and reused until one of the weights is
    replaced or changed in place (its version counter moves: ``load_state_dict``, an optimiser step,
    ``.copy_``). With autograd it is formed per call, so that gradients reach each Linear's own weight.
    """

    def __init__(self):
        self._key = None
        self._value = None

    def __call__(self, linears: tuple[nn.Linear, ...]) -> tuple[Tensor, Tensor | None]:
        tensors = [p for m in linears for p in (m.weight, m.bias) if p is not None]
        if torch.is_grad_enabled() and any(p.requires_grad for p in tensors):
            return self._concat(linears)
        key = tuple((id(p), p._version, p.dtype, p.device) for p in tensors)
        if key != self._key:
            with torch.no_grad():
                self._value = self._concat(linears)
            self._key = key
        return self._value

    @staticmethod
    def _concat(linears):
        weight = torch.cat([m.weight for m in linears])  # (ΣOut, In)
        bias = None if linears[0].bias is None else torch.cat([m.bias for m in linears])  # (ΣOut,)
        return weight, bias


def _records_grad(module, x: Tensor) -> bool:
    """Whether autograd records a projection of ``x`` by ``module``'s Linears."""
    if not torch.is_grad_enabled():
        return False
    return x.requires_grad or any(p.requires_grad for m in (module.Wq, module.Wk, module.Wv) for p in m.parameters())


def _stacked(module, linears: tuple[nn.Linear, ...]) -> tuple[Tensor, Tensor | None]:
    """The stacked ``(weight, bias)`` of ``linears``, kept on ``module`` (not as a parameter, buffer or state)
    while no weight changes (:class:`_FusedWeights`)."""
    store = module.__dict__.setdefault("_fused_weights", {})
    return store.setdefault(len(linears), _FusedWeights())(linears)


def project(module, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(Wq(query) (B, L, H·Dh), Wk(key) (B, S, Hkv·Dh), Wv(value) (B, S, Hkv·Dh))`` for a
    :class:`headwise.MultiHeadAttention`, the same numbers as calling the three ``nn.Linear``s.

    When the three inputs are one tensor (self-attention) — and, while autograd records, hold at least
    ``FUSE_MIN_TOKENS`` tokens — one matrix product with ``Wq; Wk; Wv`` stacked (as
    ``nn.MultiheadAttention``'s ``in_proj_weight`` and gpt-fast's ``wqkv``); keys and values likewise
    when they share an input. The Linears' ``forward`` (and hooks on them) is not called: a caller that
    hooks them sets ``module.fast_projections = False``.
    """
    fuse: tuple[nn.Linear, ...] = ()
    long_enough = key.shape[0] * key.shape[1] >= FUSE_MIN_TOKENS or not _records_grad(module, key)
    if not torch.compiler.is_compiling() and key is value and long_enough:
        if query is key and all(_plain(m) for m in (module.Wq, module.Wk, module.Wv)):
            fuse = (module.Wq, module.Wk, module.Wv)
        elif _plain(module.Wk) and _plain(module.Wv):
            fuse = (module.Wk, module.Wv)
    if not fuse:
        return call_linear(module.Wq, query), call_linear(module.Wk, key), call_linear(module.Wv, value)
    weight, bias = _stacked(module, fuse)
    parts = linear(key, weight, bias).split([m.out_features for m in fuse], dim=-1)  # (B, S, Out) each
    if len(fuse) == 3:
        return parts
    return (call_linear(module.Wq, query), *parts)


# Scores held at once by :func:`attention_weights`: 2**21 elements is 8 MB in float32 — small enough to
# stay in the cache and in the allocator's reused heap (glibc maps blocks over 32 MB afresh, page by page).
_WEIGHTS_CHUNK = 1 << 21


def decode_applies(module, query: Tensor, cache, *, key, value, attn_mask, key_padding_mask, need_weights,
                   position_ids, is_causal) -> bool:  # fmt: skip
    """Whether :func:`decode` computes this call of a :class:`headwise.MultiHeadAttention`: one new token of
    self-attention appended to a :class:`~headwise.core.cache.KVCache` or written into the ring of a
    :class:`~headwise.core.cache.SlidingWindowCache` (float32 or bf16 buffers on the CPU) at its default
    position, float32, no mask, no weights asked for, no gradient, no hook on the module's Linears or hook
    points, no kind the compiled step does not know (qk-norm, soft-capping, sinks, dropout while training,
    positional parts other than plain RoPE), the compiled kernels available. Calls the cache would refuse
    (a full cache, a window wider than the ring's, a non-causal call with a window) go the usual way, which
    raises."""
    kind = type(cache)
    if not kernels.enabled or key is not None or value is not None or kind not in (KVCache, SlidingWindowCache):
        return False
    if attn_mask is not None or key_padding_mask is not None or need_weights or position_ids is not None:
        return False
    m = module
    if type(query) is not Tensor or query.dtype != torch.float32 or query.device.type != "cpu":
        return False
    if query.dim() != 3 or query.shape[1] != 1 or query.shape[2] != m.d_model:
        return False
    if m.backend == "math" or not m.fast_projections or (m.training and m.dropout > 0.0):
        return False
    if m.qk_norm is not None or m.softcap is not None or m.sinks is not None or m.kdim != m.d_model:
        return False
    window, ring = m.sliding_window, kind is SlidingWindowCache
    if (ring or window is not None) and not is_causal:
        return False
    k, v = cache.k, cache.v
    if ring and ((window or 0) > cache.window or k.dtype != torch.float32):
        return False  # (a ring's update attends its new key unrounded; a bf16 ring goes the usual way)
    B, Hkv, C, Dh = k.shape
    if (B, Hkv, Dh) != (query.shape[0], m.num_kv_heads, m.head_dim) or (not ring and cache.length >= C):
        return False
    if k.dtype not in _ONE_QUERY_DTYPES or v.dtype != k.dtype or v.shape != k.shape or k.device.type != "cpu":
        return False
    if not (k.is_contiguous() and v.is_contiguous()):
        return False
    if m.positional is not None and m.positional.rotation() is None:
        return False
    if m.hook_heads.active or m.hook_pattern.active or m.hook_qk.active or _global_hooks():
        return False
    linears = (m.Wq, m.Wk, m.Wv, m.Wo)
    for lin in linears:  # _plain's checks, each parameter fetched once
        if type(lin) is not nn.Linear or lin._forward_pre_hooks or lin._forward_hooks:
            return False
        w, b = lin.weight, lin.bias
        if type(w) not in (nn.Parameter, Tensor) or w.dtype != torch.float32 or not w.is_contiguous():
            return False
        if b is not None and (type(b) not in (nn.Parameter, Tensor) or b.dtype != torch.float32):
            return False
    if torch.compiler.is_compiling() or torch.is_autocast_enabled("cpu"):
        return False
    if (torch.is_grad_enabled() or fwad._current_level >= 0) and differentiated(
        query, *(p for lin in linears for p in lin.parameters())
    ):
        return False
    return kernels.available()


def _global_hooks() -> bool:
    """Whether hooks registered for every module exist (``nn.modules.module.register_module_forward_hook``)."""
    return bool(_torch_module._global_forward_hooks or _torch_module._global_forward_pre_hooks)


def decode(module, query: Tensor, cache) -> Tensor:
    """One decoded token ``query (B, 1, D)`` through ``module`` in one compiled call (see
    :func:`decode_applies`): the same numbers as its forward — the stacked Q/K/V product, RoPE at the cache's
    length, the new key and value appended to ``cache``, attention over every cached token, ``Wo`` — with
    the round-off of a different order of sums. Returns ``(B, 1, D)``."""
    weight, bias = _stacked(module, (module.Wq, module.Wk, module.Wv))  # (H·Dh + 2·Hkv·Dh, D)
    rope = module.positional.rotation() if module.positional is not None else None
    scale = module.scale if module.scale is not None else 1.0 / math.sqrt(module.head_dim)
    t, window = cache.length, module.sliding_window  # the new token's stream index; the module's window
    if type(cache) is SlidingWindowCache:  # the ring as it lies: one query's attention needs no stream order
        slot, window = cache.next_slot(), masks.narrowest(window, cache.window)
        stream = cache.slots.clone()  # (C,): each slot's stream index, -1 empty
        stream[slot] = t
        blocked = masks.causal_slots(1, stream.shape[0], offset=t, window=window, key_slots=stream,
                                     sink_tokens=cache.sink_tokens)  # fmt: skip
        keys = (stream >= 0) & ~blocked[0]  # (C,)
    else:
        slot = t
        blocked = masks.causal_slots(1, t + 1, offset=t, window=window)  # (1, t + 1), None: every key seen
        keys = None if blocked is None else ~blocked[0]
    B = query.shape[0]
    out = kernels.decode_step(
        query.reshape(B, -1).contiguous(), weight, bias, module.Wo.weight, module.Wo.bias, cache.k, cache.v,
        slot, t, keys, module.num_heads, scale, rope,
    )  # fmt: skip
    cache.commit(1)
    return out.view(B, 1, -1)


def _rank4(m: Tensor | None) -> Tensor | None:
    return None if m is None else m.reshape((1,) * (4 - m.dim()) + tuple(m.shape))  # (B|1, H|1, L|1, S|1)


def _part(m: Tensor | None, b: int, h: slice, r: slice) -> Tensor | None:
    """The ``[b, h, r]`` block ``(h|1, r|1, S|1)`` of a rank-4 mask broadcastable to ``(B, H, L, S)``."""
    if m is None:
        return None
    return m[
        b if m.shape[0] > 1 else 0,
        h if m.shape[1] > 1 else slice(None),
        r if m.shape[2] > 1 else slice(None),
    ]


def attention_weights(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    blocked: Tensor | None = None,
    bias: Tensor | None = None,
    is_causal: bool = False,
    q_offset: int = 0,
    window: int | None = None,
    key_slots: Tensor | None = None,
    sink_tokens: int = 0,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = True,
    average_heads: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """:func:`headwise.core.functional.attention_math`'s maths, a block of scores at a time.

    Loops over batch items, groups of heads and (for long sequences) query rows so that at most
    ``_WEIGHTS_CHUNK`` scores exist at once besides the returned weights; causality and the window are
    built per block (nothing ``L × S`` beyond the weights asked for). Memory: the output, the weights if
    asked (``(B, H, L, S)``, or ``(B, L, S)`` with ``average_heads``), and one block of scores.

    Args:
        q: ``(B, H, L, Dh)``; k: ``(B, Hkv, S, Dh)``; v: ``(B, Hkv, S, Dv)``; the rest as
            :func:`headwise.core.functional.attend` (``is_causal`` and ``window`` for queries at slots
            ``q_offset … q_offset + L − 1`` over keys at ``key_slots``, default ``0 … S − 1``).
        need_weights: return the weights (False: only the output — for soft-capping or sinks).
        average_heads: weights averaged over heads ``(B, L, S)`` instead of ``(B, H, L, S)``.
    Returns:
        ``(out (B, H, L, Dv), weights or None)``; ``out`` is laid out as ``(B, L, H, Dv)`` in memory, so
        merging heads is a view.
    """
    B, H, L, _ = q.shape
    S, Dv = k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k = repeat_kv(k, H).transpose(-2, -1)  # (B, H, Dh, S)
    v = repeat_kv(v, H)  # (B, H, S, Dv)
    if softcap is None:
        q = q * scale  # scaling q (L·Dh products) is cheaper than scaling the scores (L·S)
    blocked, bias = _rank4(blocked), _rank4(bias)
    per_head = max(1, _WEIGHTS_CHUNK // max(1, L * S))
    groups = -(-H // min(H, per_head))
    hc = -(-H // groups)  # heads per block, balanced
    rc = L if hc > 1 else max(1, min(L, _WEIGHTS_CHUNK // max(1, S)))  # query rows per block
    out = q.new_empty(B, L, H, Dv)  # (B, L, H, Dv): heads merge with a view
    weights = None
    if need_weights:
        weights = q.new_empty((B, L, S) if average_heads else (B, H, L, S))
    slots = {"window": window, "key_slots": key_slots, "sink_tokens": sink_tokens, "device": q.device}
    for b in range(B):
        for r0 in range(0, L, rc):
            rs = slice(r0, min(L, r0 + rc))
            mean = None
            for h0 in range(0, H, hc):
                hs = slice(h0, min(H, h0 + hc))
                s = q[b, hs, rs] @ k[b, hs]  # (h, r, S)
                if softcap is not None:
                    s = torch.tanh(s * (scale / softcap)) * softcap  # (h, r, S): Gemma 2's soft-capping
                part_bias = _part(bias, b, hs, rs)
                if part_bias is not None:
                    s += part_bias
                part = _part(blocked, b, hs, rs)
                _, causal = masks.causality(is_causal, rs.stop - rs.start, S, q_offset=q_offset + rs.start, **slots)
                part = masks.either(part, causal)  # (r, S) causality of these query rows
                dead = masks.dead_rows(part, part_bias)
                if part is not None:
                    s.masked_fill_(part, float("-inf"))
                if dead is not None:  # a row with no key left: zeros, and no NaN in the gradient
                    s.masked_fill_(dead, 0.0)
                if sinks is None:
                    w = torch.softmax(s, dim=-1)  # (h, r, S)
                else:  # the sink logit joins the denominator (GPT-OSS ``s_aux``)
                    w = softmax(s, sinks=sinks[hs])  # (h, r, S)
                if dead is not None:
                    w = w.masked_fill(dead, 0.0)
                if dropout_p > 0.0:
                    w = F.dropout(w, p=dropout_p)
                out[b, rs, hs] = (w @ v[b, hs]).transpose(0, 1)  # (r, h, Dv)
                if weights is None:
                    continue
                if average_heads:
                    mean = w.sum(0) if mean is None else mean + w.sum(0)  # (r, S)
                else:
                    weights[b, hs, rs] = w
            if weights is not None and average_heads:
                weights[b, rs] = mean / H
    return out.transpose(1, 2), weights  # (B, H, L, Dv), weights


@functools.cache
def bf16_products() -> bool:
    """Whether a bf16 matrix product reads its bf16 operands at about their bytes' cost on this CPU, so that a
    bf16 cache is read as bf16 rather than widened to float32 first (a copy twice its size).

    True with bf16 dot-product instructions (``avx512_bf16``, AMX: oneDNN's ``brg_matmul:avx512_core_bf16``)
    and on any AVX-512 CPU (oneDNN's ``gemm:jit:bf16`` widens in registers; measured with
    ``ONEDNN_MAX_CPU_ISA=AVX512_CORE``, see docs/performance.md). ``torch.backends.cpu.get_cpu_capability()``
    names AVX-512 but not its bf16 instructions, so the flags are read from ``/proc/cpuinfo``; False where
    neither is known (AVX2 and older: oneDNN may fall back to a reference kernel there)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool({"avx512_bf16", "amx_bf16"} & flags) or "avx512f" in flags
    except OSError:
        pass
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


_ONE_QUERY_DTYPES = (torch.float32, torch.bfloat16)


def one_query_applies(q: Tensor, k: Tensor, v: Tensor, dropout_p: float) -> bool:
    """Whether :func:`attention_one_query` computes this call: one query row, CPU plain tensors in float32 /
    bfloat16 (the keys and values may be bf16 under float32 queries: a bf16 cache), no dropout, no
    gradient recorded, not inside ``torch.compile``."""
    if torch.compiler.is_compiling() or q.shape[-2] != 1 or dropout_p > 0.0:
        return False
    if any(type(t) is not Tensor or t.device.type != "cpu" or t.dtype not in _ONE_QUERY_DTYPES for t in (q, k, v)):
        return False
    if k.dtype != v.dtype or k.shape[-2] == 0:
        return False
    return not differentiated(q, k, v)


def _grouped(m: Tensor | None, H: int, Hkv: int) -> Tensor | None:
    """A mask or bias broadcastable to ``(B, H, 1, S)`` as ``(B|1, Hkv, G, S)`` (per head) or ``(B|1, 1, 1, S)``."""
    if m is None:
        return None
    m = _rank4(m)  # (B|1, H|1, 1, S|1)
    return m.reshape(m.shape[0], Hkv, H // Hkv, m.shape[-1]) if m.shape[1] == H else m


def _additive(blocked: Tensor | None, bias: Tensor | None, S: int) -> Tensor | None:
    """``bias`` with ``-inf`` where ``blocked``, float32 ``(B|1, H|1, 1, S)``; None when both are None."""
    if blocked is None and bias is None:
        return None
    add = torch.zeros((), dtype=torch.float32) if bias is None else bias.float()
    if blocked is not None:
        add = (
            add.masked_fill(blocked, float("-inf"))
            if add.shape == blocked.shape
            else torch.where(blocked, float("-inf"), add)
        )
    add = _rank4(add)  # (B|1, H|1, 1, S|1)
    return add.expand(*add.shape[:-1], S)


def _slots(t: Tensor) -> Tensor:
    """``t (B, Hkv, S, Dh)``, a cache's view of its first S slots, widened to every slot its heads' stride
    spans (``(B, Hkv, C, Dh)``, heads contiguous in batch) when that is at most 2·S and inside the storage.

    torch hands oneDNN's bf16 matmul only batch-contiguous (or transposed) operands and copies any other
    (``mkldnn_matmul``); a cache's view ``k[:, :, :S]`` of a ``(B, Hkv, C, Dh)`` buffer is strided by C, and
    that copy costs more than reading the ``C − S`` slots past the keys (their scores are set to ``-inf``).
    """
    B, Hkv, S, Dh = t.shape
    sb, sh, ss, sd = t.stride()
    if (sd, ss) != (1, Dh) or sh == S * Dh or sh % Dh or (B > 1 and sb != Hkv * sh):
        return t
    C = sh // Dh
    end = (t.storage_offset() + (B - 1) * sb + (Hkv - 1) * sh + C * Dh) * t.element_size()
    if C > 2 * S or end > t.untyped_storage().nbytes():
        return t
    return t.as_strided((B, Hkv, C, Dh), (Hkv * sh if B > 1 else sb, sh, Dh, 1))


def attention_one_query(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    blocked: Tensor | None = None,
    bias: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """One query row's attention, ``softmax(q kᵀ · scale) v``, as two matrix products per key/value head.

    A decoded token reads every cached key and value once; this is memory-bound, and two batched matrix
    products over the entries as they lie (a strided view is fine) read them at close to the read bandwidth
    where ``F.scaled_dot_product_attention``'s flash kernel, built for blocks of queries, does not (see
    docs/performance.md). The ``G = H / Hkv`` query heads of a group form one ``(G, Dh)`` block against their
    key/value head, so GQA and MQA read each entry once too. bf16 entries (a bf16 cache) are multiplied as
    bf16 with float32 scores and softmax where the CPU multiplies bf16 at its bytes' cost
    (:func:`bf16_products`; the query and the weights are then rounded to bf16), and widened to float32
    otherwise.

    Args:
        q: ``(B, H, 1, Dh)``; k: ``(B, Hkv, S, Dh)``; v: ``(B, Hkv, S, Dv)``.
        blocked: bool, True = may not attend, broadcastable to ``(B, H, 1, S)`` (causality of a window,
            padding); a row with every key blocked (or at ``-inf``) gives zeros.
        bias: float added to the scores (ALiBi, a float mask), broadcastable to ``(B, H, 1, S)``.
        scale: defaults to ``1 / sqrt(Dh)``.
    Returns:
        ``out (B, H, 1, Dv)`` in ``q``'s dtype.
    """
    B, H, _, Dh = q.shape
    Hkv, Dv = k.shape[1], v.shape[-1]
    G = H // Hkv
    scale = 1.0 / math.sqrt(Dh) if scale is None else scale
    if kernels.enabled and kernels.available():
        additive = _grouped(_additive(blocked, bias, k.shape[-2]), H, Hkv)  # (B|1, Hkv|1, G|1, S) or None
        return kernels.attention_one_query(q, k, v, additive, scale).to(q.dtype)
    if k.dtype != q.dtype and not bf16_products():
        k, v = k.to(q.dtype), v.to(q.dtype)  # widen once, then the float32 route
    S = k.shape[-2]
    if k.dtype == torch.bfloat16:
        k, v = _slots(k), _slots(v)  # (B, Hkv, C, Dh): the cache's slots, S ≤ C ≤ 2·S
    qg = (q * scale).reshape(B, Hkv, G, Dh).to(k.dtype)  # (B, Hkv, G, Dh): a group's queries as one block
    s = torch.matmul(qg, k.mT)  # (B, Hkv, G, C)
    if s.shape[-1] != S:  # the slots past the cached keys get no weight
        s[..., S:] = float("-inf")
    if s.dtype != torch.float32:
        s = s.float()  # the softmax in float32
    blocked, bias = _grouped(blocked, H, Hkv), _grouped(bias, H, Hkv)  # (B|1, Hkv|1, G|1, S)
    scores = s[..., :S]  # (B, Hkv, G, S): a view
    if bias is not None:
        scores += bias
    if blocked is not None:
        scores.masked_fill_(blocked, float("-inf"))
    p = torch.softmax(s, dim=-1)  # (B, Hkv, G, C)
    dead = masks.dead_rows(blocked, bias)  # (B|1, Hkv|1, G|1, 1): rows with no key left, or None
    if dead is not None:
        p.masked_fill_(dead, 0.0)
    out = torch.matmul(p.to(v.dtype), v)  # (B, Hkv, G, Dv)
    return out.to(q.dtype).view(B, H, 1, Dv)
