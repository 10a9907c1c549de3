"""Hugging Face attention modules into headwise's :class:`MultiHeadAttention`.

``from_hf(module)`` reads the weights and the configuration of one Hugging Face ``transformers`` attention
module and returns a headwise module that computes the same function of the same hidden states:

=====================  ===================================================  ====================================
Hugging Face module    weights                                              call the headwise module as
=====================  ===================================================  ====================================
``LlamaAttention``     ``q_proj, k_proj, v_proj, o_proj`` (GQA, RoPE half)  ``mine(x, is_causal=True)``
``MistralAttention``   the same, no biases; ``sliding_window``              ``mine(x, is_causal=True)``
``Qwen2Attention``     the same, biases on Q/K/V only                       ``mine(x, is_causal=True)``
``Qwen3Attention``     the same, ``q_norm``/``k_norm`` per head (QK-norm)   ``mine(x, is_causal=True)``
``Olmo2Attention``     the same, QK-norm over the whole projections         ``mine(x, is_causal=True)``
``Gemma2Attention``    soft-capped scores, local/global layers              ``mine(x, is_causal=True)``
``Gemma3Attention``    QK-norm (``1 + weight``), local/global layers         ``mine(x, is_causal=True)``
``Starcoder2Attention``  biases, ``sliding_window`` on every layer          ``mine(x, is_causal=True)``
``GptOssAttention``    learned ``sinks``, local/global layers, YaRN         ``mine(x, is_causal=True)``
``DeepseekV3Attention``  latent attention -> :class:`LatentAttention`        ``mine(x, is_causal=True)``
``GPT2Attention``      fused ``Conv1D c_attn (D, 3D)``, ``c_proj (D, D)``   ``mine(x, is_causal=True)``
``BertAttention``      ``self.query/key/value``, ``output.dense`` as Wo     ``mine(x, key_padding_mask=pad)``
=====================  ===================================================  ====================================

What "the same output" means, per family:

- The RoPE decoders (Llama and every family after it in the table): the attention module's first output
  (after ``o_proj``) for hidden states at positions ``0 … L−1`` (or the ``position_ids`` you pass, which must
  be those the model gave its rotary embedding). The rotary embedding lives in the *model* in Hugging Face
  (``LlamaRotaryEmbedding``, from the config's ``rope_theta`` / ``rope_parameters``, per layer type for
  Gemma 3); headwise carries it inside the converted module as a
  :class:`~headwise.positional.rope.RotaryEmbedding` with ``convention="half"`` (``rotate_half``), or
  ``"interleaved"`` for DeepSeek-V3's ``rope_interleave`` (which rotates interleaved pairs and lays the
  result out by halves: the same scores). The masks Hugging Face builds in the model (causal, sliding window
  per layer type) are the converted module's own options: ``sliding_window`` where the layer has one.
- GPT-2: the module's first output after ``c_proj`` (and ``resid_dropout``, the identity in eval mode).
  GPT-2's learned positions are added to the embeddings before the block, so none are inside attention.
- BERT: ``BertAttention`` returns ``LayerNorm(dropout(dense(self_attention(x))) + x)``. headwise's module ends
  at the output projection, so ``from_hf(bert_attention)(x)`` equals ``bert_attention.output.dense`` applied
  to ``bert_attention.self(x)``; the residual and LayerNorm stay in the block around it
  (``bert_attention.output.LayerNorm(mine(x)[0] + x)`` is the whole ``BertAttention`` output in eval mode).

The converted module keeps the attention-weight dropout probability and the ``training`` flag of the
source; GPT-2's ``resid_dropout`` and BERT's hidden dropout act outside attention and are not carried.
Importing this file does not import ``transformers``: modules are recognised by their class name and
their ``transformers.models.*`` home.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from headwise.core.attention import MultiHeadAttention
from headwise.core.latent import LatentAttention
from headwise.positional.rope import RotaryEmbedding

SUPPORTED = (
    "LlamaAttention",
    "MistralAttention",
    "Qwen2Attention",
    "Qwen3Attention",
    "Olmo2Attention",
    "Gemma2Attention",
    "Gemma3Attention",
    "Starcoder2Attention",
    "GptOssAttention",
    "DeepseekV3Attention",
    "GPT2Attention",
    "BertAttention",
)
ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # what headwise's RotaryEmbedding(scaling=...) computes
_ROPE_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
}
_YARN_OPTIONAL = ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate")


def from_hf(module: nn.Module) -> MultiHeadAttention | LatentAttention:
    """A headwise :class:`MultiHeadAttention` equal to a Hugging Face attention module.

    Args:
        module: a ``transformers`` attention module of a family in :data:`SUPPORTED` (see the module
            docstring for what is compared).
    Returns:
        A new module with copies of the weights, on the source's device and dtype, in its training mode: a
        :class:`MultiHeadAttention`, or a :class:`~headwise.core.latent.LatentAttention` for DeepSeek-V3.
        Call it with ``is_causal=True`` for the decoders and with ``key_padding_mask`` for BERT's padding.
    Raises:
        TypeError: ``module`` is another type (the message lists the supported ones).
        ValueError: a configuration option headwise does not model — a RoPE type other than
            ``default``/``linear``/``llama3``/``yarn``, partial rotary embeddings, GPT-2's
            ``reorder_and_upcast_attn``, BERT's relative position embeddings — named in the message.
    """
    cls = type(module)
    converter = _CONVERTERS.get(cls.__name__) if cls.__module__.startswith("transformers.models.") else None
    if converter is None:
        hint = ""
        if cls.__name__.startswith("Bert") and cls.__name__.endswith(("SelfAttention", "CrossAttention")):
            hint = " (pass its parent BertAttention: headwise needs output.dense as Wo)"
        raise TypeError(
            f"module: expected a Hugging Face attention module, one of {', '.join(SUPPORTED)}; "
            f"got {cls.__module__}.{cls.__qualname__}{hint}"
        )
    out = converter(module)
    out.train(module.training)
    return out


# -- shared pieces -------------------------------------------------------------------------------------


def _build(
    *,
    like: Tensor,
    d_model: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    weights: tuple[Tensor, Tensor, Tensor, Tensor],
    biases: tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None],
    dropout: float,
    scale: float,
    positional=None,
    kdim: int | None = None,
    vdim: int | None = None,
    **kinds,
) -> MultiHeadAttention:
    """A MultiHeadAttention holding ``weights`` ``(out, in)`` (Linear convention) and ``biases`` for Q, K, V, O.

    A projection whose bias is None gets a bias-free ``nn.Linear`` (Qwen2 has biases on Q/K/V, not O).
    ``kinds``: the module's keyword options (``sliding_window``, ``softcap``, ``sinks``, ``qk_norm``, ``norm_eps``).
    """
    mha = MultiHeadAttention(
        d_model,
        num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        bias=any(b is not None for b in biases),
        dropout=float(dropout or 0.0),
        kdim=kdim,
        vdim=vdim,
        positional=positional,
        scale=None if math.isclose(scale, head_dim**-0.5, rel_tol=1e-12) else float(scale),
        device=like.device,
        dtype=like.dtype,
        **kinds,
    )
    with torch.no_grad():
        for name, w, b in zip(("Wq", "Wk", "Wv", "Wo"), weights, biases):
            lin = getattr(mha, name)
            if tuple(w.shape) != tuple(lin.weight.shape):
                raise ValueError(
                    f"module: {name} weight of shape {tuple(w.shape)} does not fit {num_heads} heads "
                    f"({num_kv_heads} key/value heads) of width {head_dim} at d_model={d_model}; "
                    f"expected {tuple(lin.weight.shape)}"
                )
            if b is None and lin.bias is not None:
                lin = nn.Linear(lin.in_features, lin.out_features, bias=False, device=like.device, dtype=like.dtype)
                setattr(mha, name, lin)
            lin.weight.copy_(w)
            if b is not None:
                lin.bias.copy_(b)
    return mha


def _heads(features: int, head_dim: int, what: str) -> int:
    if features % head_dim:
        raise ValueError(f"module: {what} has {features} output features, not a multiple of head_dim={head_dim}")
    return features // head_dim


# -- Llama, Mistral, Qwen2 ------------------------------------------------------------------------------


def _rope_parameters(config, layer_type: str | None = None) -> tuple[dict, str]:
    """RoPE settings as one flat dict: transformers 5 ``rope_parameters`` (per layer type for Gemma 3);
    4.x ``rope_theta``, ``rope_scaling``."""
    params = getattr(config, "rope_parameters", None)
    if params is not None:
        where = "config.rope_parameters"
        if layer_type is not None and isinstance(params.get(layer_type), dict):
            params, where = params[layer_type], f"config.rope_parameters[{layer_type!r}]"
        nested = [k for k, v in params.items() if isinstance(v, dict)]
        if nested:
            raise ValueError(f"{where}: RoPE settings per layer type ({', '.join(nested)}) are not supported")
        params = dict(params)
    else:
        where = "config.rope_scaling"
        params = dict(getattr(config, "rope_scaling", None) or {})
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return params, where


def _rope_from_config(
    config, head_dim: int, *, layer_type: str | None = None, convention: str = "half"
) -> RotaryEmbedding:
    params, where = _rope_parameters(config, layer_type)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(
            f"{where}: rope_type {kind!r} is not supported by headwise (supported: {', '.join(ROPE_TYPES)})"
        )
    partial = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    if partial is not None and float(partial) != 1.0:
        raise ValueError(
            f"{where}: partial_rotary_factor={partial!r} is not supported "
            "(headwise rotates the whole head; expected 1.0)"
        )
    scaling = None
    if kind != "default":
        if kind in ("llama3", "yarn"):
            params.setdefault("original_max_position_embeddings", getattr(config, "max_position_embeddings", None))
        if kind == "yarn" and params.get("factor") is None:  # DeepSeek: the ratio of the two context lengths
            params["factor"] = config.max_position_embeddings / params["original_max_position_embeddings"]
        missing = [k for k in _ROPE_KEYS[kind] if params.get(k) is None]
        if missing:
            raise ValueError(f"{where}: rope_type {kind!r} needs {', '.join(missing)}; got {params}")
        keys = _ROPE_KEYS[kind] + (_YARN_OPTIONAL if kind == "yarn" else ())
        scaling = {"rope_type": kind, **{k: params[k] for k in keys if params.get(k) is not None}}
    return RotaryEmbedding(head_dim, base=float(params["rope_theta"]), convention=convention, scaling=scaling)


def _window(m, config) -> int | None:
    """The layer's sliding window: the module's own (per layer type), else the config's for the families
    that window every layer (Mistral, Starcoder2)."""
    if hasattr(m, "sliding_window"):
        return m.sliding_window
    if type(m).__name__ in ("MistralAttention", "Starcoder2Attention"):
        return getattr(config, "sliding_window", None)
    return None


def _qk_norm(m) -> tuple[str | None, Tensor | None, Tensor | None, float]:
    """``(kind, q weight, k weight, eps)`` of a module's QK-norm: per head (Qwen3, Gemma 3) or full width (OLMo 2).

    Gemma 3's RMSNorm multiplies by ``1 + weight``; the converted weight is ``1 + weight``.
    """
    qn, kn = getattr(m, "q_norm", None), getattr(m, "k_norm", None)
    if qn is None:
        return None, None, None, 1e-6
    kind = "head" if qn.weight.shape[0] == m.head_dim else "full"
    eps = float(getattr(qn, "variance_epsilon", getattr(qn, "eps", 1e-6)))
    offset = 1.0 if type(qn).__name__ == "Gemma3RMSNorm" else 0.0
    return kind, qn.weight.detach() + offset, kn.weight.detach() + offset, eps


def _from_llama_like(m) -> MultiHeadAttention:
    """``LlamaAttention`` and its descendants: separate Q/K/V/O Linears, half-split RoPE, GQA via ``repeat_kv``,
    and each family's kinds — a sliding window, soft-capping, sinks, QK-norm."""
    config = m.config
    if getattr(m, "is_causal", True) is False:
        raise ValueError(
            f"config.use_bidirectional_attention=True: {type(m).__name__} attending both ways is not supported "
            "(headwise converts the causal decoders; expected False)"
        )
    head_dim = int(m.head_dim)
    num_heads = _heads(m.q_proj.out_features, head_dim, "q_proj")
    num_kv_heads = _heads(m.k_proj.out_features, head_dim, "k_proj")
    projections = (m.q_proj, m.k_proj, m.v_proj, m.o_proj)
    qk_norm, q_norm, k_norm, eps = _qk_norm(m)
    softcap = getattr(m, "attn_logit_softcapping", None)
    if softcap is None and type(m).__name__ == "Gemma2Attention":
        softcap = getattr(config, "attn_logit_softcapping", None)
    sinks = getattr(m, "sinks", None)
    mha = _build(
        like=m.q_proj.weight,
        d_model=m.q_proj.in_features,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        weights=tuple(p.weight for p in projections),
        biases=tuple(p.bias for p in projections),
        dropout=getattr(m, "attention_dropout", 0.0),
        scale=float(getattr(m, "scaling", head_dim**-0.5)),
        positional=_rope_from_config(config, head_dim, layer_type=getattr(m, "layer_type", None)),
        sliding_window=_window(m, config),
        softcap=softcap,
        sinks=sinks is not None,
        qk_norm=qk_norm,
        norm_eps=eps,
    )
    with torch.no_grad():
        if sinks is not None:
            mha.sinks.copy_(sinks)
        if qk_norm is not None:
            mha.q_norm.weight.copy_(q_norm)
            mha.k_norm.weight.copy_(k_norm)
    return mha


# -- DeepSeek-V3 ------------------------------------------------------------------------------------------


def _from_deepseek(m) -> LatentAttention:
    """``DeepseekV3Attention``: latent attention; ``q_a_proj``/``q_a_layernorm``/``q_b_proj`` (or ``q_proj``),
    ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``; RoPE on the ``qk_rope_head_dim``
    features (interleaved pairs with ``rope_interleave``), YaRN scaling, and the module's own ``scaling``
    (``qk_head_dim^-0.5`` times ``mscale²``)."""
    config = m.config
    q_lora = m.q_lora_rank
    mine = LatentAttention(
        m.hidden_size,
        m.num_heads,
        kv_lora_rank=m.kv_lora_rank,
        qk_nope_head_dim=m.qk_nope_head_dim,
        qk_rope_head_dim=m.qk_rope_head_dim,
        v_head_dim=m.v_head_dim,
        q_lora_rank=q_lora,
        bias=m.o_proj.bias is not None,
        positional=_rope_from_config(
            config,
            m.qk_rope_head_dim,
            convention="interleaved" if getattr(config, "rope_interleave", False) else "half",
        ),
        scale=float(m.scaling),
        norm_eps=float(m.kv_a_layernorm.variance_epsilon),
        dropout=float(getattr(m, "attention_dropout", 0.0) or 0.0),
        device=m.o_proj.weight.device,
        dtype=m.o_proj.weight.dtype,
    )
    if q_lora is not None and m.q_a_layernorm.variance_epsilon != m.kv_a_layernorm.variance_epsilon:
        raise ValueError("module: q_a_layernorm and kv_a_layernorm with different eps are not supported")
    pairs = [
        (mine.Wkv_a, m.kv_a_proj_with_mqa),
        (mine.kv_norm, m.kv_a_layernorm),
        (mine.Wkv_b, m.kv_b_proj),
        (mine.Wo, m.o_proj),
    ]
    if q_lora is None:
        pairs.append((mine.Wq, m.q_proj))
    else:
        pairs += [(mine.Wq_a, m.q_a_proj), (mine.q_norm, m.q_a_layernorm), (mine.Wq_b, m.q_b_proj)]
    with torch.no_grad():
        for dst, src in pairs:
            dst.weight.copy_(src.weight)
            if getattr(dst, "bias", None) is not None:
                dst.bias.copy_(src.bias)
    return mine


# -- GPT-2 -------------------------------------------------------------------------------------------------


def _from_gpt2(m) -> MultiHeadAttention:
    """``GPT2Attention``: ``Conv1D`` layers hold ``weight (in, out)``, the transpose of an ``nn.Linear``'s."""
    if getattr(m, "reorder_and_upcast_attn", False):
        raise ValueError(
            "config.reorder_and_upcast_attn=True: GPT-2's float32 re-ordered score path is not supported "
            "(expected False, the default)"
        )
    d, dh = m.embed_dim, m.head_dim
    scale = getattr(m, "scaling", None)
    if scale is None:  # transformers 4.x computes it inside _attn
        scale = dh**-0.5 if m.scale_attn_weights else 1.0
        if m.scale_attn_by_inverse_layer_idx:
            scale /= float(m.layer_idx + 1)
    if getattr(m, "is_cross_attention", False):
        wq, bq = m.q_attn.weight, m.q_attn.bias  # (D, D), (D,)
        wk, wv = m.c_attn.weight.split(d, dim=1)  # (D, 2D) -> (D, D) each
        bk, bv = m.c_attn.bias.split(d)
    else:
        wq, wk, wv = m.c_attn.weight.split(d, dim=1)  # (D, 3D) -> (D, D) each
        bq, bk, bv = m.c_attn.bias.split(d)
    return _build(
        like=m.c_attn.weight,
        d_model=d,
        num_heads=m.num_heads,
        num_kv_heads=m.num_heads,
        head_dim=dh,
        weights=(wq.T, wk.T, wv.T, m.c_proj.weight.T),  # Conv1D (in, out) -> Linear (out, in)
        biases=(bq, bk, bv, m.c_proj.bias),
        dropout=m.attn_dropout.p,
        scale=float(scale),
    )


# -- BERT --------------------------------------------------------------------------------------------------


def _from_bert(m) -> MultiHeadAttention:
    """``BertAttention``: ``self.query/key/value`` and ``output.dense`` (the residual LayerNorm stays outside)."""
    s = m.self
    kind = getattr(s, "position_embedding_type", "absolute")  # transformers 4.x
    if kind != "absolute":
        raise ValueError(
            f"config.position_embedding_type={kind!r}: BERT's relative position scores are not supported "
            f"(expected 'absolute')"
        )
    dh = int(s.attention_head_size)
    projections = (s.query, s.key, s.value, m.output.dense)
    return _build(
        like=s.query.weight,
        d_model=s.query.in_features,
        num_heads=_heads(s.query.out_features, dh, "self.query"),
        num_kv_heads=_heads(s.key.out_features, dh, "self.key"),
        head_dim=dh,
        weights=tuple(p.weight for p in projections),
        biases=tuple(p.bias for p in projections),
        dropout=s.dropout.p,
        scale=float(getattr(s, "scaling", dh**-0.5)),
        kdim=s.key.in_features,
        vdim=s.value.in_features,
    )


_CONVERTERS = {
    "LlamaAttention": _from_llama_like,
    "MistralAttention": _from_llama_like,
    "Qwen2Attention": _from_llama_like,
    "Qwen3Attention": _from_llama_like,
    "Olmo2Attention": _from_llama_like,
    "Gemma2Attention": _from_llama_like,
    "Gemma3Attention": _from_llama_like,
    "Starcoder2Attention": _from_llama_like,
    "GptOssAttention": _from_llama_like,
    "DeepseekV3Attention": _from_deepseek,
    "GPT2Attention": _from_gpt2,
    "BertAttention": _from_bert,
}
