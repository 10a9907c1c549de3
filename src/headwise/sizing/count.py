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

KV cache: ``2 (K and V) * N * Hkv * Dh * bytes per element`` per token, times sequence length and batch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from headwise import checks
from headwise.sizing.arch import Architecture, ArticleClaim

__all__ = [
    "AttentionParams",
    "ParamBreakdown",
    "ClaimCheck",
    "DTYPE_BYTES",
    "attention_params",
    "param_breakdown",
    "total_params",
    "kv_cache_bytes",
    "dtype_bytes",
    "as_mha",
    "check_article",
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
            in one layer, biases included.
        num_layers: N.
    """

    q: int
    k: int
    v: int
    o: int
    num_layers: int

    @property
    def per_layer(self) -> int:
        """Q + K + V + O of one layer."""
        return self.q + self.k + self.v + self.o

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
    d, qdim, kvdim = arch.hidden_size, arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    return AttentionParams(
        q=_linear(d, qdim, arch.qkv_bias),
        k=_linear(d, kvdim, arch.qkv_bias),
        v=_linear(d, kvdim, arch.qkv_bias),
        o=_linear(qdim, d, arch.o_bias),
        num_layers=arch.num_layers,
    )


def _ffn_per_layer(arch: Architecture) -> int:
    d, f, b = arch.hidden_size, arch.intermediate_size, arch.mlp_bias
    up = _linear(d, f, b) * (2 if arch.ffn == "gated" else 1)  # gated: gate and up projections
    return up + _linear(f, d, b)


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
        ffn=_ffn_per_layer(arch) * n,
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


def kv_cache_bytes(arch: Architecture, seq_len: int, batch: int = 1, dtype: str = "bf16") -> int:
    """Bytes a full key/value cache of ``arch`` holds: ``2 * N * Hkv * Dh * seq_len * batch * bytes``.

    Every layer is assumed to keep every position (no sliding-window cap, no paging overhead).

    Args:
        arch: the architecture.
        seq_len: cached positions per sequence, >= 1.
        batch: sequences, >= 1.
        dtype: element type of the cache, see :func:`dtype_bytes`.

    Returns:
        The size in bytes.

    Raises:
        ValueError: ``seq_len`` or ``batch`` not a positive integer, or an unknown ``dtype``.
    """
    checks.positive_int("seq_len", seq_len)
    checks.positive_int("batch", batch)
    per_token = 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim  # K and V, every layer
    return per_token * seq_len * batch * dtype_bytes(dtype)


def as_mha(arch: Architecture) -> Architecture:
    """The same architecture with plain multi-head attention (``num_kv_heads = num_heads``).

    Args:
        arch: the architecture (GQA, MQA or MHA).

    Returns:
        A copy with ``num_kv_heads = num_heads``, named ``"<name> (MHA)"``, without published
        figures or article claims (they describe the real model).
    """
    return dataclasses.replace(
        arch,
        name=f"{arch.name} (MHA)",
        num_kv_heads=arch.num_heads,
        published_total=None,
        published_text="",
        published_source="",
        article=None,
    )


@dataclass(frozen=True)
class ClaimCheck:
    """One claimed figure of an article against the computed one.

    Attributes:
        quantity: ``"attention"``, ``"total"`` or ``"attention_share"``.
        claimed: the article's value.
        computed: the value computed from the architecture.
        rel_error: ``claimed / computed - 1``.
        agrees: ``|rel_error| <= tolerance`` of the claim.
    """

    quantity: str
    claimed: float
    computed: float
    rel_error: float
    agrees: bool


def check_article(arch: Architecture, claim: ArticleClaim | None = None) -> list[ClaimCheck]:
    """Compare what an article says about ``arch`` with the computed figures.

    Args:
        arch: the architecture.
        claim: the claim to check; default ``arch.article``.

    Returns:
        One :class:`ClaimCheck` per claimed quantity (empty when there is no claim).
    """
    claim = arch.article if claim is None else claim
    if claim is None:
        return []
    attention, total = attention_params(arch).total, total_params(arch)
    computed = {"attention": attention, "total": total, "attention_share": attention / total}
    checks = []
    for quantity, claimed in claim.claims.items():
        rel = claimed / computed[quantity] - 1.0
        checks.append(ClaimCheck(quantity, claimed, computed[quantity], rel, abs(rel) <= claim.tolerance))
    return checks
