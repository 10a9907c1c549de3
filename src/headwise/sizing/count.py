"""Parameter and KV-cache arithmetic for an :class:`~headwise.sizing.arch.Architecture`.

Notation: D model width, H query heads, Hkv key/value heads, Dh head width, F feed-forward width,
V vocabulary, P learned positions, T token types, N layers. A Linear ``a -> b`` holds ``a*b`` weights
plus ``b`` biases when it has a bias.

Per layer::

    Q = D*(H*Dh)   [+ H*Dh]        K = V = D*(Hkv*Dh) [+ Hkv*Dh]       O = (H*Dh)*D [+ D]
    FFN  mlp:   D*F + F*D   [+ F + D]          gated: 2*D*F + F*D  [+ 2F + D]
    norms: norms_per_layer * D  (RMSNorm)  or  * 2D  (LayerNorm, weight + bias)

Once: V*D token embedding, P*D learned positions, T*D token types, a norm after the embeddings
(BERT) or after the last block (GPT-2, Llama), BERT's pooler D*D + D, and V*D for an untied LM head.

Multi-head latent attention (DeepSeek-V2 §2.1, Rq query rank, R key/value rank, Dr rotary width,
Dn = Dh − Dr, Dv value width)::

    Q = D*Rq + Rq (RMSNorm) + Rq*H*Dh     (or D*H*Dh when Rq = 0)
    K = D*(R + Dr) + R (RMSNorm) + R*H*Dn  the shared down-projection to the latent and rope key, key up-projection
    V = R*H*Dv                            O = H*Dv*D

Inside attention besides Q, K, V, O (``extra``): QK-norm weights (2·Dh per head-wise layer, (H + Hkv)·Dh
full width) and GPT-OSS's H sink logits. A mixture-of-experts FFN holds E routed experts and the shared
ones, each a gated FFN of width ``moe_intermediate_size``, plus a router D*E (+ E biases).

KV cache per cached position and layer: ``2 (K and V) * Hkv * Dh`` elements, or ``R + Dr`` for latent
attention (only the latent and the rope key are cached, DeepSeek-V3 ``inference/model.py``, ``absorb``).
A windowed layer caches at most ``sliding_window`` positions (Mistral 7B's rolling buffer); the total
is summed over layers, times batch and bytes per element.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from headwise import checks
from headwise.sizing.arch import Architecture

__all__ = [
    "AttentionParams",
    "ParamBreakdown",
    "DTYPE_BYTES",
    "attention_params",
    "param_breakdown",
    "total_params",
    "kv_cache_bytes",
    "kv_cache_elements",
    "kv_cache_variants",
    "KVVariant",
    "dtype_bytes",
    "as_mha",
]

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "int8": 1}
_DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}


def _linear(fan_in: int, fan_out: int, bias: bool) -> int:
    return fan_in * fan_out + (fan_out if bias else 0)


def _norm(arch: Architecture, width: int) -> int:
    return 2 * width if arch.norm == "layernorm" else width


@dataclass(frozen=True)
class AttentionParams:
    """Attention projection parameters (weights + biases) of one layer, and over all layers.

    Attributes:
        q, k, v, o: parameters of W_Q (D -> H*Dh), W_K and W_V (D -> Hkv*Dh) and W_O (H*Dh -> D)
            in one layer, biases included (latent attention: see the module docstring).
        num_layers: N.
        extra: other attention parameters of one layer: QK-norm weights, sink logits.
    """

    q: int
    k: int
    v: int
    o: int
    num_layers: int
    extra: int = 0

    @property
    def per_layer(self) -> int:
        """Q + K + V + O (+ extra) of one layer."""
        return self.q + self.k + self.v + self.o + self.extra

    @property
    def total(self) -> int:
        """All layers: ``per_layer * num_layers``."""
        return self.per_layer * self.num_layers


@dataclass(frozen=True)
class ParamBreakdown:
    """Where the parameters of a model sit; every field counts over the whole model.

    Attributes:
        token_embedding: V*D.
        position_embedding: P*D for learned positions, else 0 (RoPE has no parameters).
        token_type_embedding: T*D (BERT), else 0.
        embedding_norm: the norm after the embeddings (BERT), else 0.
        attention: Q, K, V, O over all layers.
        ffn: the feed-forward blocks over all layers.
        layer_norms: the norms inside the blocks over all layers.
        final_norm: the norm after the last block, else 0.
        pooler: BERT's pooler, else 0.
        output_head: an untied LM head V*D, else 0.
    """

    token_embedding: int
    position_embedding: int
    token_type_embedding: int
    embedding_norm: int
    attention: int
    ffn: int
    layer_norms: int
    final_norm: int
    pooler: int
    output_head: int

    @property
    def embeddings(self) -> int:
        """Token, position and token-type tables plus the embedding norm."""
        return self.token_embedding + self.position_embedding + self.token_type_embedding + self.embedding_norm

    @property
    def total(self) -> int:
        """Every parameter, each counted once (a tied head is the token embedding)."""
        return sum(getattr(self, f.name) for f in dataclasses.fields(self))


def attention_params(arch: Architecture) -> AttentionParams:
    """Attention projection parameters of ``arch``: Q, K, V, O per layer, and ``.total`` over layers.

    Args:
        arch: the architecture.

    Returns:
        An :class:`AttentionParams`. With GQA (Hkv < H) K and V are H/Hkv times smaller than Q.
    """
    d, h, dh = arch.hidden_size, arch.num_heads, arch.head_dim
    extra = h if arch.attention_sinks else 0
    if arch.kv_lora_rank:
        rq, r, dr, dv = arch.q_lora_rank, arch.kv_lora_rank, arch.qk_rope_head_dim, arch.value_head_dim
        q = _linear(d, rq, arch.qkv_bias) + rq + rq * h * dh if rq else d * h * dh
        return AttentionParams(
            q=q,
            k=_linear(d, r + dr, arch.qkv_bias) + r + r * h * (dh - dr),
            v=r * h * dv,
            o=_linear(h * dv, d, arch.o_bias),
            num_layers=arch.num_layers,
            extra=extra,
        )
    qdim, kvdim = h * dh, arch.num_kv_heads * dh
    if arch.qk_norm == "head":
        extra += 2 * dh
    elif arch.qk_norm == "full":
        extra += qdim + kvdim
    return AttentionParams(
        q=_linear(d, qdim, arch.qkv_bias),
        k=_linear(d, kvdim, arch.qkv_bias),
        v=_linear(d, kvdim, arch.qkv_bias),
        o=_linear(qdim, d, arch.o_bias),
        num_layers=arch.num_layers,
        extra=extra,
    )


def _ffn(arch: Architecture, f: int, bias: bool) -> int:
    d = arch.hidden_size
    up = _linear(d, f, bias) * (2 if arch.ffn == "gated" else 1)  # gated: gate and up projections
    return up + _linear(f, d, bias)


def _ffn_total(arch: Architecture) -> int:
    """The feed-forward blocks over all layers: dense ones, and mixture-of-experts ones."""
    dense = _ffn(arch, arch.intermediate_size, arch.mlp_bias)
    if not arch.num_experts:
        return dense * arch.num_layers
    e, f = arch.num_experts, arch.moe_intermediate_size or arch.intermediate_size
    routed = e * _ffn(arch, f, arch.expert_bias or arch.mlp_bias)
    moe = routed + arch.shared_experts * _ffn(arch, f, arch.mlp_bias) + _linear(arch.hidden_size, e, arch.expert_bias)
    return dense * arch.dense_layers + moe * (arch.num_layers - arch.dense_layers)


def param_breakdown(arch: Architecture) -> ParamBreakdown:
    """Every parameter of ``arch``, grouped (see :class:`ParamBreakdown`).

    Args:
        arch: the architecture.

    Returns:
        The breakdown; ``.total`` is the model's parameter count.
    """
    d, n = arch.hidden_size, arch.num_layers
    return ParamBreakdown(
        token_embedding=arch.vocab_size * d,
        position_embedding=arch.max_positions * d if arch.learned_positions else 0,
        token_type_embedding=arch.type_vocab_size * d,
        embedding_norm=_norm(arch, d) if arch.embedding_norm else 0,
        attention=attention_params(arch).total,
        ffn=_ffn_total(arch),
        layer_norms=arch.norms_per_layer * _norm(arch, d) * n,
        final_norm=_norm(arch, d) if arch.final_norm else 0,
        pooler=_linear(d, d, True) if arch.pooler else 0,
        output_head=arch.vocab_size * d if arch.output_head == "separate" else 0,
    )


def total_params(arch: Architecture) -> int:
    """All parameters of ``arch`` (a tied LM head counted once).

    Args:
        arch: the architecture.

    Returns:
        The exact count, as ``sum(p.numel() for p in model.parameters())`` would give.
    """
    return param_breakdown(arch).total


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a cache dtype name.

    Args:
        dtype: ``"bf16"``, ``"fp16"``, ``"fp32"`` or ``"int8"`` (also ``"bfloat16"``, ``"float16"``,
            ``"half"``, ``"float32"``, ``"float"``), case-insensitive.

    Returns:
        2, 2, 4 or 1.

    Raises:
        ValueError: an unknown dtype name.
    """
    key = str(dtype).strip().lower()
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {'|'.join(DTYPE_BYTES)}; got {dtype!r}")
    return DTYPE_BYTES[key]


def _check_sizes(seq_len, batch) -> None:
    checks.positive_int("seq_len", seq_len)
    checks.positive_int("batch", batch)


def kv_cache_elements(arch: Architecture) -> int:
    """Elements one layer caches per position: ``2 * Hkv * Dh`` (K and V), or ``R + Dr`` for latent attention."""
    if arch.kv_lora_rank:
        return arch.kv_lora_rank + arch.qk_rope_head_dim
    return 2 * arch.num_kv_heads * arch.head_dim


def _cached_positions(arch: Architecture, seq_len: int) -> int:
    """Positions summed over layers: windowed layers hold ``min(seq_len, W)``, the others ``seq_len``."""
    windowed = arch.sliding_layers
    return (arch.num_layers - windowed) * seq_len + windowed * min(seq_len, arch.sliding_window or seq_len)


def kv_cache_bytes(arch: Architecture, seq_len: int, batch: int = 1, dtype: str = "bf16") -> int:
    """Bytes the key/value cache of ``arch`` holds after ``seq_len`` positions.

    ``kv_cache_elements(arch) * Σ_layers cached positions * batch * bytes``: a layer with a sliding window
    holds at most ``sliding_window`` positions (a ring buffer), the others every position; latent attention
    caches ``R + Dr`` elements per position and layer. No paging overhead.

    Args:
        arch: the architecture.
        seq_len: positions seen per sequence, >= 1.
        batch: sequences, >= 1.
        dtype: element type of the cache, see :func:`dtype_bytes`.

    Returns:
        The size in bytes.

    Raises:
        ValueError: ``seq_len`` or ``batch`` not a positive integer, or an unknown ``dtype``.
    """
    _check_sizes(seq_len, batch)
    return kv_cache_elements(arch) * _cached_positions(arch, seq_len) * batch * dtype_bytes(dtype)


@dataclass(frozen=True)
class KVVariant:
    """One row of the KV-cache comparison: a kind of attention at the same width, heads and layers.

    Attributes:
        name: ``"MHA"``, ``"GQA"``, ``"MQA"``, ``"MLA"`` or ``"sliding window"``.
        shape: what one layer caches per position, in words (``"2 × 8 KV heads × 128"``).
        per_token: bytes one more position adds while every layer still grows (all layers, batch 1).
        total: bytes at the asked ``seq_len × batch``.
        own: whether this row is the architecture's own attention.
        source: where the kind (and its sizes here) come from.
    """

    name: str
    shape: str
    per_token: int
    total: int
    own: bool
    source: str


def kv_cache_variants(arch: Architecture, seq_len: int, batch: int = 1, dtype: str = "bf16") -> list[KVVariant]:
    """The KV cache of ``arch`` beside MHA, GQA, MQA, MLA and sliding-window caches of the same shape.

    Same width, heads, head width and layers; only what is cached changes (DeepSeek-V2, Table 1, compares
    MHA, GQA, MQA and MLA this way). Sizes not in ``arch`` come from the kinds' own papers: GQA with
    ``num_kv_heads`` (or 8 groups, Llama-2-70B's choice in Ainslie et al. 2023), MLA with ``R = 4·Dh`` and
    ``Dr = Dh/2`` (DeepSeek-V2 §2.1.3), a window of ``sliding_window`` (or Mistral 7B v0.1's 4096) on every
    layer. For a latent-attention model the MHA row caches expanded keys of width Dh and values of width Dv.

    Returns:
        One :class:`KVVariant` per kind, the architecture's own marked ``own``; its ``total`` equals
        :func:`kv_cache_bytes`.
    Raises:
        ValueError: as :func:`kv_cache_bytes`.
    """
    _check_sizes(seq_len, batch)
    size = dtype_bytes(dtype)
    h, n, dh, dv = arch.num_heads, arch.num_layers, arch.head_dim, arch.value_head_dim
    mla = arch.kv_lora_rank > 0
    full = dataclasses.replace(arch, sliding_window=0, global_layers=0)  # every layer keeps every position
    own = "MLA" if mla else ("sliding window" if arch.sliding_window else arch.attention_variant)
    groups = arch.num_kv_heads if 1 < arch.num_kv_heads < h else next((g for g in (8, 4, 2) if h % g == 0 and g < h), 0)
    r, dr = arch.kv_lora_rank or 4 * dh, arch.qk_rope_head_dim or dh // 2
    mla_source = "DeepSeek-V2 (arXiv:2405.04434) §2.1 and Table 1; DeepSeek-V3 inference/model.py, absorb"
    rows = [
        (
            "MHA",
            h * (dh + dv),
            full,
            f"2 × {h} KV heads × {dh}" if not mla else f"{h} heads × ({dh} K + {dv} V)",
            "Vaswani et al. 2017, §3.2.2",
        )
    ]
    if not mla:
        if groups:
            rows.append(("GQA", 2 * groups * dh, full, f"2 × {groups} KV heads × {dh}", "Ainslie et al. 2023 (GQA)"))
        rows.append(("MQA", 2 * dh, full, f"2 × 1 KV head × {dh}", "Shazeer 2019 (MQA)"))
    rows.append(
        ("MLA", r + dr, full, f"latent {r} + rope key {dr}", mla_source + ("" if mla else "; R = 4·Dh, Dr = Dh/2"))
    )
    if not mla:
        windowed = arch if arch.sliding_window else dataclasses.replace(arch, sliding_window=4096, global_layers=0)
        layers = f"{windowed.sliding_layers} of {n} layers" if windowed.global_layers else "every layer"
        rows.append(
            (
                "sliding window",
                kv_cache_elements(arch),
                windowed,
                f"2 × {arch.num_kv_heads} KV heads × {dh}, ≤ {windowed.sliding_window} positions on {layers}",
                "Beltagy et al. 2020 (Longformer); Jiang et al. 2023 (Mistral 7B, rolling buffer cache)",
            )
        )
    return [
        KVVariant(
            name,
            shape,
            elements * n * size,
            elements * _cached_positions(layout, seq_len) * batch * size,
            name == own,
            source,
        )
        for name, elements, layout, shape, source in rows
    ]


def as_mha(arch: Architecture) -> Architecture:
    """The same architecture with plain multi-head attention (``num_kv_heads = num_heads``).

    Args:
        arch: the architecture (GQA, MQA, MHA or MLA; a latent-attention model becomes full-rank
            Q, K, V, O of head width ``head_dim``; a sliding window is kept).

    Returns:
        A copy with ``num_kv_heads = num_heads``, named ``"<name> (MHA)"``, without the published
        figures (they describe the real model).
    """
    return dataclasses.replace(
        arch,
        name=f"{arch.name} (MHA)",
        num_kv_heads=arch.num_heads,
        kv_lora_rank=0,
        q_lora_rank=0,
        qk_rope_head_dim=0,
        v_head_dim=0,
        published_total=None,
        published_text="",
        published_source="",
    )
