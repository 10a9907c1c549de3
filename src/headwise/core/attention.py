"""``MultiHeadAttention``: a thin holder of the four projections around one attention call.

Shape legend: B batch, L query length, S key length (cached ones included), D model width,
H query heads, Hkv key/value heads, Dh head width.

Mask convention (as ``torch.nn.MultiheadAttention``): a boolean mask is True where a query **may not**
attend; a float mask is added to the scores. A query row with every key masked gets zero weights and a
zero attention output (before ``Wo``) — never NaN, in forward and backward.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from headwise import checks
from headwise.core import decode, masks, projections
from headwise.core.cache import Cache, KVCache, SlidingWindowCache
from headwise.core.call import BACKENDS, AttentionCall
from headwise.core.hooks import HookPoint, attend_hooked
from headwise.positional.base import PositionalPart

QK_NORMS = (None, "head", "full")


class MultiHeadAttention(nn.Module):
    """Multi-head attention, Vaswani et al. 2017 §3.2.2, batch-first, with GQA/MQA, RoPE, ALiBi and a KV cache.

    ``Wq``, ``Wk``, ``Wv``, ``Wo`` are separate ``nn.Linear`` layers, as in the first article's
    from-scratch module (66,048 parameters at ``d_model=128, num_heads=4``).

    Args:
        d_model: D, the width of queries and of the output.
        num_heads: H, query heads.
        num_kv_heads: Hkv (default H); must divide H. Key/value head g serves query heads
            ``g·H/Hkv … (g+1)·H/Hkv − 1`` (grouped-query attention, Ainslie et al. 2023; 1 = multi-query,
            Shazeer 2019), as Hugging Face Llama's ``repeat_kv``.
        head_dim: Dh (default ``D // H``); real configs allow ``H·Dh ≠ D``.
        bias: biases on all four projections.
        dropout: dropout probability on the attention weights while training, in [0, 1).
        kdim, vdim: widths of the key and value inputs (default D), as ``nn.MultiheadAttention``.
        positional: a part acting inside attention — ``RotaryEmbedding(head_dim)``, ``ALiBi(num_heads)`` — or None.
        scale: score scale (default ``1 / sqrt(Dh)``).
        backend: ``"auto"`` (``F.scaled_dot_product_attention`` unless weights are asked for), ``"math"``
            (the readable path end to end: the four ``nn.Linear``s called as modules and
            :func:`headwise.core.functional.attention_math`) or ``"sdpa"``.
        fast_projections: with a backend other than ``"math"``, run the projections through
            :mod:`headwise.core.projections` (oneDNN's fused-bias linear; ``Wq; Wk; Wv`` as one product for
            self-attention over ≥ 1024 tokens) — their weights are used directly, so their ``forward`` and
            any hooks on them are not called. Set False (also as an attribute) to call each ``nn.Linear``.
        sliding_window: W: a causal call's query ``i`` sees only keys ``i − W + 1 … i`` (Mistral 7B v0.1,
            Starcoder2, the local layers of Gemma 2/3 and GPT-OSS; Hugging Face ``sliding_window``). Computed
            by the SDPA kernel with a banded ``(L, S)`` boolean mask, or by the blocked path; a
            :class:`~headwise.core.cache.SlidingWindowCache` keeps only the last W keys.
        softcap: c: scores ``c · tanh(s / c)`` before masks and biases (Gemma 2's ``attn_logit_softcapping``).
            The kernel cannot cap, so the call runs :func:`headwise.core.blocked.attention_weights` (scores a
            block at a time, never ``(B, H, L, S)`` at once) or the math path.
        sinks: learn one sink logit per query head, ``self.sinks (H,)`` (zeros at first), joining each row's
            softmax denominator without a value (GPT-OSS ``s_aux``); same paths as ``softcap``.
        qk_norm: ``"head"`` — RMSNorm (``self.q_norm``, ``self.k_norm`` of width Dh) over each head's queries and
            keys before RoPE (Qwen3; Gemma 3); ``"full"`` — over the whole projections, widths ``H·Dh`` and
            ``Hkv·Dh`` (OLMo 2); None.
        norm_eps: the QK-norm epsilon.
    Raises:
        ValueError / TypeError: sizes that are not positive integers, ``D % H ≠ 0`` without ``head_dim``,
        ``H % Hkv ≠ 0``, dropout outside [0, 1), an unknown backend, a positional part that does not fit, a
        window ≤ 0, a cap ≤ 0, an unknown ``qk_norm``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        kdim: int | None = None,
        vdim: int | None = None,
        positional: PositionalPart | None = None,
        scale: float | None = None,
        backend: str = "auto",
        fast_projections: bool = True,
        sliding_window: int | None = None,
        softcap: float | None = None,
        sinks: bool = False,
        qk_norm: str | None = None,
        norm_eps: float = 1e-6,
        device=None,
        dtype=None,
    ):
        super().__init__()
        checks.positive_int("d_model", d_model)
        checks.positive_int("num_heads", num_heads)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        checks.positive_int("num_kv_heads", num_kv_heads)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_kv_heads: expected a divisor of num_heads={num_heads}, got {num_kv_heads}")
        if head_dim is None:
            if d_model % num_heads:
                raise ValueError(
                    f"num_heads: expected a divisor of d_model={d_model} (or pass head_dim), got {num_heads}"
                )
            head_dim = d_model // num_heads
        checks.positive_int("head_dim", head_dim)
        kdim = d_model if kdim is None else kdim
        vdim = d_model if vdim is None else vdim
        checks.positive_int("kdim", kdim)
        checks.positive_int("vdim", vdim)
        checks.probability("dropout", dropout)
        checks.one_of("backend", backend, BACKENDS)
        if positional is not None:
            if not isinstance(positional, PositionalPart):
                raise TypeError(
                    "positional: expected a PositionalPart (RotaryEmbedding, ALiBi) or None, "
                    f"got {type(positional).__name__}"
                )
            positional.check(num_heads=num_heads, head_dim=head_dim)
        if sliding_window is not None:
            checks.positive_int("sliding_window", sliding_window)
        if softcap is not None:
            softcap = checks.positive_number("softcap", softcap)
        if not isinstance(sinks, bool):
            raise TypeError(f"sinks: expected True (learn one sink logit per head) or False, got {sinks!r}")
        checks.one_of("qk_norm", qk_norm, QK_NORMS)
        norm_eps = checks.positive_number("norm_eps", norm_eps)

        self.d_model, self.num_heads, self.num_kv_heads, self.head_dim = (
            d_model,
            num_heads,
            num_kv_heads,
            head_dim,
        )
        self.kdim, self.vdim, self.dropout, self.scale, self.backend = (
            kdim,
            vdim,
            float(dropout),
            scale,
            backend,
        )
        kw = {"bias": bias, "device": device, "dtype": dtype}
        self.Wq = nn.Linear(d_model, num_heads * head_dim, **kw)
        self.Wk = nn.Linear(kdim, num_kv_heads * head_dim, **kw)
        self.Wv = nn.Linear(vdim, num_kv_heads * head_dim, **kw)
        self.Wo = nn.Linear(num_heads * head_dim, d_model, **kw)
        self.positional = positional
        self.hook_heads, self.hook_pattern = HookPoint(), HookPoint()  # where gates, ablation, capture act
        self.hook_qk = HookPoint()  # post-rotary q and k with the masks: AttentionRows, while hooked
        self.fast_projections = bool(fast_projections)
        self.sliding_window, self.softcap, self.qk_norm = sliding_window, softcap, qk_norm
        if sinks:
            self.sinks = nn.Parameter(torch.zeros(num_heads, device=device, dtype=dtype))  # (H,)
        else:
            self.register_parameter("sinks", None)
        if qk_norm is not None:
            q_width, k_width = (
                (head_dim, head_dim) if qk_norm == "head" else (num_heads * head_dim, num_kv_heads * head_dim)
            )
            self.q_norm = nn.RMSNorm(q_width, eps=norm_eps, device=device, dtype=dtype)
            self.k_norm = nn.RMSNorm(k_width, eps=norm_eps, device=device, dtype=dtype)

    def extra_repr(self) -> str:
        kinds = "".join(
            f", {name}={value!r}"
            for name, value in (
                ("sliding_window", self.sliding_window),
                ("softcap", self.softcap),
                ("sinks", self.sinks is not None or None),
                ("qk_norm", self.qk_norm),
            )
            if value is not None
        )
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, dropout={self.dropout}, backend={self.backend!r}{kinds}"
        )

    # -- input checks ------------------------------------------------------------------------------
    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        for name, t, width in (
            ("query", query, self.d_model),
            ("key", key, self.kdim),
            ("value", value, self.vdim),
        ):
            if not isinstance(t, Tensor):
                raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
            if t.dim() != 3:
                raise ValueError(f"{name}: expected a rank-3 tensor (B, L, {width}), got shape {tuple(t.shape)}")
            if t.shape[-1] != width:
                raise ValueError(f"{name}: expected last dimension {width}, got shape {tuple(t.shape)}")
            if not t.is_floating_point():
                raise TypeError(f"{name}: expected a floating-point tensor, got dtype {t.dtype}")
            if t.shape[1] == 0:
                raise ValueError(f"{name}: expected at least one token, got shape {tuple(t.shape)}")
        weight_dtype = self.Wq.weight.dtype
        if not torch.is_autocast_enabled(query.device.type):
            for name, t in (("query", query), ("key", key), ("value", value)):
                if t.dtype != weight_dtype:
                    raise TypeError(
                        f"{name}: expected dtype {weight_dtype} (the module's; cast one of them, or use autocast), "
                        f"got {t.dtype}"
                    )
        if not query.shape[0] == key.shape[0] == value.shape[0]:
            raise ValueError(
                f"query, key, value: batch sizes differ: {query.shape[0]}, {key.shape[0]}, {value.shape[0]}"
            )
        if key.shape[1] != value.shape[1]:
            raise ValueError(f"key, value: sequence lengths differ: {key.shape[1]} and {value.shape[1]}")

    # -- projections -------------------------------------------------------------------------------
    def _heads(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(q (B, H, L, Dh), k (B, Hkv, S, Dh), v (B, Hkv, S, Dh))``: the projections (as modules on the readable
        path, through :func:`headwise.core.projections.project` otherwise: the same numbers), QK-norm, heads."""
        if self.backend == "math" or not self.fast_projections:
            q, k, v = self.Wq(query), self.Wk(key), self.Wv(value)
        else:
            q, k, v = projections.project(self, query, key, value)
        if self.qk_norm == "full":  # OLMo 2: over the whole projections
            q, k = self.q_norm(q), self.k_norm(k)
        B, L, S, dh = query.shape[0], query.shape[1], key.shape[1], self.head_dim
        q = q.view(B, L, -1, dh).transpose(1, 2)  # (B, H, L, Dh)
        k = k.view(B, S, -1, dh).transpose(1, 2)  # (B, Hkv, S, Dh)
        v = v.view(B, S, -1, dh).transpose(1, 2)  # (B, Hkv, S, Dh)
        if self.qk_norm == "head":  # Qwen3: each head's q and k, before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def _output(self, x: Tensor) -> Tensor:
        """``Wo(x)``: ``(B, L, H·Dh) -> (B, L, D)``."""
        if self.backend == "math" or not self.fast_projections:
            return self.Wo(x)
        return projections.call_linear(self.Wo, x)

    def _local_sinks(self) -> Tensor | None:
        """``sinks (H,)`` of the heads this module computes (a DTensor shard under tensor parallelism)."""
        sinks = self.sinks
        return sinks.to_local() if sinks is not None and hasattr(sinks, "to_local") else sinks

    # -- caches and the compiled decode step ---------------------------------------------------------
    def new_cache(self, batch_size: int, capacity: int, *, sink_tokens: int = 0, dtype=None, device=None) -> KVCache:
        """A cache for this module, in its dtype and device unless given: a :class:`~headwise.core.cache.KVCache`
        of ``capacity`` tokens, ``(batch_size, Hkv, capacity, Dh)`` — or, with a ``sliding_window`` W, a
        :class:`~headwise.core.cache.SlidingWindowCache` holding at most ``W + sink_tokens`` of them whatever
        ``capacity`` asks (it decodes past it). Hkv counts this rank's heads under tensor parallelism.
        Raises:
            ValueError: sizes that are not positive integers, ``sink_tokens`` without a window.
        """
        w = self.Wk.weight
        local = w.to_local() if hasattr(w, "to_local") else w  # a DTensor under tensor parallelism
        sizes = (local.shape[0] // self.head_dim, self.head_dim)
        kw = {"dtype": dtype or w.dtype, "device": device or w.device}
        if self.sliding_window is not None:
            checks.positive_int("capacity", capacity)
            return SlidingWindowCache(batch_size, self.sliding_window, *sizes, sink_tokens=sink_tokens, **kw)
        if sink_tokens:
            raise ValueError(
                f"sink_tokens: StreamingLLM's sinks need a window; got {sink_tokens} for a module without "
                "sliding_window (build a SlidingWindowCache with the window you want)"
            )
        return KVCache(batch_size, capacity, *sizes, **kw)

    def decodes_compiled(self, query: Tensor, cache: Cache, is_causal: bool) -> bool:
        """Whether one token ``query (B, 1, D)`` of self-attention into ``cache``, with no mask, weights or
        positions asked, runs through the compiled decode step (:func:`headwise.core.decode.step`): this module's
        kinds allow it — a fast backend with fast projections, no dropout while training, no qk-norm,
        soft-capping or sinks, keys of width D, plain RoPE or no positional part, no hooked point — and the call
        does (:func:`headwise.core.decode.applies`). The step gives the forward's numbers."""
        if self.backend == "math" or not self.fast_projections or (self.training and self.dropout > 0.0):
            return False
        if self.qk_norm is not None or self.softcap is not None or self.sinks is not None or self.kdim != self.d_model:
            return False
        if (self.sliding_window is not None or type(cache) is SlidingWindowCache) and not is_causal:
            return False
        if self.hook_heads.active or self.hook_pattern.active or self.hook_qk.active:
            return False
        if self.positional is not None and self.positional.rotation() is None:
            return False
        linears = (self.Wq, self.Wk, self.Wv, self.Wo)
        return decode.applies(query, cache, linears, self.num_kv_heads, self.head_dim, self.sliding_window) and (
            query.shape[2] == self.d_model
        )

    @staticmethod
    def _positions(position_ids: Tensor | None, B: int, L: int, offset: int, device) -> Tensor:
        if position_ids is None:
            return torch.arange(offset, offset + L, device=device)  # (L,)
        if not isinstance(position_ids, Tensor) or position_ids.is_floating_point() or position_ids.dtype == torch.bool:
            raise TypeError(f"position_ids: expected an integer tensor, got {position_ids!r:.80}")
        if tuple(position_ids.shape) not in ((L,), (B, L)):
            raise ValueError(
                f"position_ids: expected shape (L,)=({L},) or (B, L)=({B}, {L}), got {tuple(position_ids.shape)}"
            )
        return position_ids.to(device)

    # -- forward -----------------------------------------------------------------------------------
    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        attn_mask: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        average_weights: bool = True,
        position_ids: Tensor | None = None,
        cache: Cache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` to ``key``/``value`` (default: ``query`` itself — self-attention).

        Args:
            query: ``(B, L, D)``; key: ``(B, S, kdim)``; value: ``(B, S, vdim)`` (defaults to ``key``).
            attn_mask: bool (True = may not attend) or float (added): ``(L, S)``, ``(B, L, S)`` or ``(B, H, L, S)``,
                S counting cached keys.
            key_padding_mask: ``(B, S)``, bool (True = padding) or float (added).
            is_causal: query slot ``i`` attends key slots ``j ≤ i`` (slots count from the start of the cache);
                combined with any other mask.
            need_weights: also return the attention weights (math path).
            average_weights: weights ``(B, L, S)`` averaged over heads (True) or ``(B, H, L, S)``.
            position_ids: token positions ``(L,)`` or ``(B, L)`` for RoPE / ALiBi (default: the slots
                ``cache.length … cache.length + L − 1``).
            cache: a :class:`~headwise.core.cache.KVCache` (the new keys and values are appended), or a
                :class:`~headwise.core.cache.SlidingWindowCache` (a ring of the last ``sliding_window`` keys,
                plus StreamingLLM's first tokens) for a windowed module: ``S`` then counts the held keys plus the
                new ones, and causality and the window are placed on their own slots (the cache's
                :class:`~headwise.core.cache.CacheRead` says where they sit).
        Returns:
            ``(out (B, L, D), weights or None)``.
        Raises:
            ValueError / TypeError: wrong rank, width or dtype of an input, differing batch sizes, masks or
            positions whose shape or dtype does not fit, a full cache.
        """
        plain = key is None and value is None and attn_mask is None and key_padding_mask is None
        plain = plain and cache is not None and not need_weights and position_ids is None
        if plain and self.decodes_compiled(query, cache, is_causal):  # one token, one compiled call (same numbers)
            return decode.step(self, query, cache), None
        self_attention = key is None and value is None
        key = query if key is None else key
        value = key if value is None else value
        self._check_inputs(query, key, value)
        masks.require_causal(is_causal, self.sliding_window)
        B, L, _ = query.shape
        S_new = key.shape[1]
        offset = 0 if cache is None else cache.length  # the new tokens' first index in the stream
        # S: every key attended; the cache checks the call before anything changes
        S = S_new if cache is None else cache.keys_after(S_new, is_causal=is_causal, window=self.sliding_window)
        q_pos = self._positions(position_ids, B, L, offset, query.device)  # (L,) or (B, L)

        q, k, v = self._heads(query, key, value)  # (B, H, L, Dh), (B, Hkv, S_new, Dh) twice
        # The masks are checked before the cache changes (H: this rank's heads under tensor parallelism).
        blocked, bias = masks.build(
            attn_mask=attn_mask, key_padding_mask=key_padding_mask, batch=B, heads=q.shape[1], L=L, S=S,
            dtype=q.dtype,
        )  # fmt: skip
        k_pos = q_pos if self_attention else torch.arange(offset, offset + S_new, device=query.device)
        if self.positional is not None:
            q, k = self.positional.rotate_qk(q, k, q_pos, k_pos)
        if cache is not None:
            read = cache.update(k, v, k_pos)  # the keys in stream order and where they sit
            (k, v), k_pos = read.tensors, read.positions  # (B, Hkv, S, Dh) each, (B, S)
            if position_ids is None:
                k_pos = k_pos[0]  # (S,): default positions are the same for every item
        if self.positional is not None:
            bias = masks.added(bias, self.positional.score_bias(q_pos, k_pos))  # ALiBi: (B|1, H, L, S)
        call = AttentionCall(
            blocked=blocked, bias=bias, is_causal=is_causal, q_offset=offset, window=self.sliding_window,
            scale=self.scale, softcap=self.softcap, sinks=self._local_sinks(),
            dropout_p=self.dropout if self.training else 0.0, need_weights=need_weights,
            average_heads=average_weights, backend=self.backend,
        )  # fmt: skip
        out, weights = attend_hooked(self, q, k, v, call if cache is None else read.place(call))
        out = self._output(out.transpose(1, 2).reshape(B, L, -1))  # (B, H, L, Dh) -> (B, L, H·Dh) -> (B, L, D)
        return out, weights
