"""The shape of a real transformer, as data: what a parameter count or a KV-cache size needs.

Notation: D model width (``hidden_size``), H query heads, Hkv key/value heads, Dh head width,
F feed-forward width (``intermediate_size``), V vocabulary, P learned positions, T token types.

An :class:`Architecture` stores only the shape. Totals are computed from it (``count.py``); the figure
others publish is kept apart (``published_total``) to compare against.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Any

__all__ = ["Architecture", "FFN_KINDS", "NORM_KINDS", "OUTPUT_HEADS", "MODEL_KINDS"]

FFN_KINDS = ("mlp", "gated")  # mlp: up + down (GELU); gated: gate + up + down (SwiGLU / GeGLU)
NORM_KINDS = ("layernorm", "rmsnorm")  # layernorm: weight + bias; rmsnorm: weight only
OUTPUT_HEADS = ("tied", "separate", "none")
MODEL_KINDS = ("encoder", "decoder")
QK_NORMS = ("", "head", "full")  # "": none; "head": RMSNorm over each head (Qwen3, Gemma 3); "full": over H·Dh (OLMo 2)


def check_int(value: Any, key: str, where: str, *, minimum: int = 1) -> int:
    """Return ``value`` if it is an int >= ``minimum`` (bools refused), else raise naming ``key``.

    Raises:
        ValueError: ``value`` is not an integer, or is below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: {key!r} must be an integer >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{where}: {key!r} must be an integer >= {minimum}, got {value}")
    return value


def check_bool(value: Any, key: str, where: str) -> bool:
    """Return ``value`` if it is a bool, else raise naming ``key``.

    Raises:
        ValueError: ``value`` is not ``True`` or ``False``.
    """
    if not isinstance(value, bool):
        raise ValueError(f"{where}: {key!r} must be true or false, got {value!r} ({type(value).__name__})")
    return value


def check_choice(value: Any, key: str, where: str, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise naming ``key``.

    Raises:
        ValueError: ``value`` is not one of ``choices``.
    """
    if value not in choices:
        raise ValueError(f"{where}: {key!r} must be one of {', '.join(choices)}; got {value!r}")
    return value


@dataclass(frozen=True)
class Architecture:
    """The shape of one transformer (encoder or decoder), enough for exact parameter counts.

    Attributes:
        name: display name, e.g. ``"Llama-3-8B"``.
        vocab_size: V, rows of the token embedding.
        hidden_size: D, the model width.
        num_layers: number of transformer blocks.
        num_heads: H, query heads.
        num_kv_heads: Hkv, key/value heads (= H for plain MHA, 1 for MQA); divides H.
        head_dim: Dh, width of one head (H * Dh may differ from D, as in Gemma-2).
        intermediate_size: F, the feed-forward width.
        ffn: ``"mlp"`` (D->F, F->D) or ``"gated"`` (D->F twice, F->D: SwiGLU / GeGLU).
        qkv_bias, o_bias, mlp_bias: whether those Linears carry a bias.
        norm: ``"layernorm"`` (weight + bias, D each) or ``"rmsnorm"`` (weight only).
        norms_per_layer: norms inside each block (2 usually, 4 for Gemma-2's sandwich norms).
        embedding_norm: a norm right after the embeddings (BERT).
        final_norm: a norm after the last block (GPT-2 ``ln_f``, Llama ``norm``).
        max_positions: context length the model was configured for.
        learned_positions: a learned (P, D) position table (BERT, GPT-2) rather than RoPE.
        type_vocab_size: T, rows of BERT's token-type (segment) table; 0 when absent.
        output_head: ``"tied"``, ``"separate"`` (its own V x D matrix, no bias) or ``"none"``.
        pooler: BERT's pooler, a D x D Linear with bias.
        kind: ``"encoder"`` or ``"decoder"``.
        source: where the numbers come from (paper, Hugging Face config.json).
        activation: the FFN's nonlinearity, for the record (no effect on counts).
        aliases: other names :func:`headwise.sizing.get_arch` accepts.
        published_total: the total others publish, to compare against; ``None`` if unknown.
        published_text: that figure as published, e.g. ``"6.738B"``.
        published_source: where it is published.
        notes: remarks shown with the model.
        sliding_window: W, the keys a windowed layer sees (0: none); its cache holds at most W positions.
        global_layers: with a window, the layers that still see every position (Gemma 2, Gemma 3, GPT-OSS
            alternate; 0: every layer is windowed, as Mistral 7B v0.1).
        qk_norm: ``""``, ``"head"`` (RMSNorm of width Dh on q and k: Qwen3, Gemma 3) or ``"full"`` (widths H·Dh
            and Hkv·Dh: OLMo 2).
        attention_sinks: H learned sink logits per layer (GPT-OSS).
        q_lora_rank, kv_lora_rank, qk_rope_head_dim, v_head_dim: multi-head latent attention (DeepSeek-V2/V3)
            when ``kv_lora_rank`` > 0: Rq (0: a full-rank W_Q), R, Dr and Dv; ``head_dim`` is then the
            query/key head width Dn + Dr. ``v_head_dim`` 0 means ``head_dim``.
        num_experts, experts_per_token, shared_experts, moe_intermediate_size, dense_layers, expert_bias:
            a mixture-of-experts FFN (0 experts: dense): E routed experts of width ``moe_intermediate_size``
            (default F), each token using ``experts_per_token``; always-on shared experts (DeepSeek); the first
            ``dense_layers`` layers keep a dense FFN of width F (DeepSeek ``first_k_dense_replace``); biases on
            the experts and the router (GPT-OSS).

    Raises:
        ValueError: a size is not a positive integer, ``num_kv_heads`` does not divide
            ``num_heads``, or a kind is not one of the known ones; the message names the field.
    """

    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    ffn: str
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    norm: str
    norms_per_layer: int
    embedding_norm: bool
    final_norm: bool
    max_positions: int
    learned_positions: bool
    type_vocab_size: int
    output_head: str
    pooler: bool
    kind: str = "decoder"
    source: str = ""
    activation: str = ""
    aliases: tuple[str, ...] = ()
    published_total: float | None = None
    published_text: str = ""
    published_source: str = ""
    notes: str = ""
    sliding_window: int = 0
    global_layers: int = 0
    qk_norm: str = ""
    attention_sinks: bool = False
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    shared_experts: int = 0
    moe_intermediate_size: int = 0
    dense_layers: int = 0
    expert_bias: bool = False

    def __post_init__(self) -> None:
        where = f"architecture {self.name!r}"
        for key in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
            check_int(getattr(self, key), key, where)
        check_int(self.intermediate_size, "intermediate_size", where)
        check_int(self.max_positions, "max_positions", where)
        check_int(self.norms_per_layer, "norms_per_layer", where, minimum=0)
        check_int(self.type_vocab_size, "type_vocab_size", where, minimum=0)
        for key in ("qkv_bias", "o_bias", "mlp_bias", "embedding_norm", "final_norm"):
            check_bool(getattr(self, key), key, where)
        check_bool(self.learned_positions, "learned_positions", where)
        check_bool(self.pooler, "pooler", where)
        check_choice(self.ffn, "ffn", where, FFN_KINDS)
        check_choice(self.norm, "norm", where, NORM_KINDS)
        check_choice(self.output_head, "output_head", where, OUTPUT_HEADS)
        check_choice(self.kind, "kind", where, MODEL_KINDS)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"{where}: 'num_kv_heads' ({self.num_kv_heads}) must divide 'num_heads' ({self.num_heads})"
            )
        for key in (
            "sliding_window",
            "global_layers",
            "q_lora_rank",
            "kv_lora_rank",
            "qk_rope_head_dim",
            "v_head_dim",
            "num_experts",
            "experts_per_token",
            "shared_experts",
            "moe_intermediate_size",
            "dense_layers",
        ):
            check_int(getattr(self, key), key, where, minimum=0)
        check_bool(self.attention_sinks, "attention_sinks", where)
        check_bool(self.expert_bias, "expert_bias", where)
        check_choice(self.qk_norm, "qk_norm", where, QK_NORMS)
        if self.global_layers > (self.num_layers if self.sliding_window else 0):
            raise ValueError(
                f"{where}: 'global_layers' ({self.global_layers}) must be at most 'num_layers' ({self.num_layers}) "
                "and needs a 'sliding_window'"
            )
        if self.kv_lora_rank:
            if not 0 < self.qk_rope_head_dim < self.head_dim or self.qk_rope_head_dim % 2:
                raise ValueError(
                    f"{where}: 'qk_rope_head_dim' ({self.qk_rope_head_dim}) must be even and below "
                    f"'head_dim' ({self.head_dim} = nope + rope width) for latent attention"
                )
            for key in ("kv_lora_rank", "q_lora_rank"):
                if getattr(self, key) > self.hidden_size:
                    raise ValueError(
                        f"{where}: {key!r} ({getattr(self, key)}) must be at most 'hidden_size' ({self.hidden_size})"
                    )
        elif self.q_lora_rank or self.qk_rope_head_dim:
            raise ValueError(
                f"{where}: 'q_lora_rank' and 'qk_rope_head_dim' need 'kv_lora_rank' > 0 (latent attention)"
            )
        if self.num_experts and not 0 < self.experts_per_token <= self.num_experts:
            raise ValueError(
                f"{where}: 'experts_per_token' ({self.experts_per_token}) must be in 1..'num_experts' "
                f"({self.num_experts})"
            )
        if self.dense_layers > self.num_layers:
            raise ValueError(f"{where}: 'dense_layers' ({self.dense_layers}) exceeds 'num_layers' ({self.num_layers})")

    @property
    def group_size(self) -> int:
        """Query heads served by one key/value head: H / Hkv (1 = MHA, H = MQA)."""
        return self.num_heads // self.num_kv_heads

    @property
    def value_head_dim(self) -> int:
        """Dv: the value head width (``v_head_dim``, or ``head_dim`` when that is 0)."""
        return self.v_head_dim or self.head_dim

    @property
    def sliding_layers(self) -> int:
        """Layers whose cache is capped at ``sliding_window`` positions."""
        return self.num_layers - self.global_layers if self.sliding_window else 0

    @property
    def attention_variant(self) -> str:
        """``"MLA"`` (latent attention), ``"MHA"``, ``"MQA"`` or ``"GQA"``, from the head counts."""
        if self.kv_lora_rank:
            return "MLA"
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"

    @classmethod
    def from_dict(cls, entry: dict[str, Any], *, where: str = "architecture") -> Architecture:
        """Build one from an entry of ``headwise/data/architectures.json``.

        Args:
            entry: the JSON object; ``published`` is an optional sub-object.
            where: how to name the entry in error messages.

        Returns:
            The architecture.

        Raises:
            ValueError: a field is missing, unknown, or of the wrong type; the message names it.
        """
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(entry).__name__}")
        data = dict(entry)
        name = data.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: 'name' must be a non-empty string, got {name!r}")
        where = f"architecture {name!r}"
        published = data.pop("published", None) or {}
        required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        missing = [key for key in required if key not in data]
        if missing:
            raise ValueError(f"{where}: missing key {missing[0]!r}")
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r}")
        data["aliases"] = tuple(data.get("aliases", ()))
        if published:
            total = published.get("total")
            if isinstance(total, bool) or not isinstance(total, (int, float)) or total <= 0:
                raise ValueError(f"{where}: 'published.total' must be a positive number, got {total!r}")
            data["published_total"] = float(total)
            data["published_text"] = str(published.get("text", ""))
            data["published_source"] = str(published.get("source", ""))
        return cls(**data)
