"""Hugging Face attention modules into headwise's :class:`MultiHeadAttention`.

``from_hf(module)`` reads the weights and the configuration of one Hugging Face ``transformers`` attention
module and returns a headwise module that computes the same function of the same hidden states:

=====================  ===================================================  ====================================
Hugging Face module    weights                                              call the headwise module as
=====================  ===================================================  ====================================
``LlamaAttention``     ``q_proj, k_proj, v_proj, o_proj`` (GQA, RoPE half)  ``mine(x, is_causal=True)``
``MistralAttention``   the same, no biases, ``sliding_window=None`` only    ``mine(x, is_causal=True)``
``Qwen2Attention``     the same, biases on Q/K/V only                       ``mine(x, is_causal=True)``
``GPT2Attention``      fused ``Conv1D c_attn (D, 3D)``, ``c_proj (D, D)``   ``mine(x, is_causal=True)``
``BertAttention``      ``self.query/key/value``, ``output.dense`` as Wo     ``mine(x, key_padding_mask=pad)``
=====================  ===================================================  ====================================

What "the same output" means, per family:

- Llama, Mistral, Qwen2: the attention module's first output (after ``o_proj``) for hidden states at
  positions ``0 … L−1`` (or the ``position_ids`` you pass, which must be those the model gave its rotary
  embedding). The rotary embedding lives in the *model* in Hugging Face (``LlamaRotaryEmbedding``, from the
  config's ``rope_theta`` / ``rope_parameters``); headwise carries it inside the converted module as a
  :class:`~headwise.positional.rope.RotaryEmbedding` with ``convention="half"`` (``rotate_half``).
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
from headwise.positional.rope import RotaryEmbedding

SUPPORTED = ("LlamaAttention", "MistralAttention", "Qwen2Attention", "GPT2Attention", "BertAttention")
ROPE_TYPES = ("default", "linear", "llama3")  # what headwise's RotaryEmbedding(scaling=...) computes
_ROPE_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


def from_hf(module: nn.Module) -> MultiHeadAttention:
    """A headwise :class:`MultiHeadAttention` equal to a Hugging Face attention module.

    Args:
        module: a ``transformers`` ``LlamaAttention``, ``MistralAttention``, ``Qwen2Attention``,
            ``GPT2Attention`` or ``BertAttention`` (see the module docstring for what is compared).
    Returns:
        A new module with copies of the weights, on the source's device and dtype, in its training mode.
        Call it with ``is_causal=True`` for the decoders and with ``key_padding_mask`` for BERT's padding.
    Raises:
        TypeError: ``module`` is another type (the message lists the supported ones).
        ValueError: a configuration option headwise does not model — a RoPE type other than
            ``default``/``linear``/``llama3``, partial rotary embeddings, a sliding window, GPT-2's
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
) -> MultiHeadAttention:
    """A MultiHeadAttention holding ``weights`` ``(out, in)`` (Linear convention) and ``biases`` for Q, K, V, O.

    A projection whose bias is None gets a bias-free ``nn.Linear`` (Qwen2 has biases on Q/K/V, not O).
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


def _rope_parameters(config) -> tuple[dict, str]:
    """RoPE settings as one flat dict: transformers 5 ``rope_parameters``; 4.x ``rope_theta``, ``rope_scaling``."""
    params = getattr(config, "rope_parameters", None)
    if params is not None:
        where = "config.rope_parameters"
        nested = [k for k, v in params.items() if isinstance(v, dict)]
        if nested:
            raise ValueError(f"{where}: RoPE settings per layer type ({', '.join(nested)}) are not supported")
        params = dict(params)
    else:
        where = "config.rope_scaling"
        params = dict(getattr(config, "rope_scaling", None) or {})
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return params, where


def _rope_from_config(config, head_dim: int) -> RotaryEmbedding:
    params, where = _rope_parameters(config)
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
        if kind == "llama3":
            params.setdefault("original_max_position_embeddings", getattr(config, "max_position_embeddings", None))
        missing = [k for k in _ROPE_KEYS[kind] if params.get(k) is None]
        if missing:
            raise ValueError(f"{where}: rope_type {kind!r} needs {', '.join(missing)}; got {params}")
        scaling = {"rope_type": kind, **{k: params[k] for k in _ROPE_KEYS[kind]}}
    return RotaryEmbedding(head_dim, base=float(params["rope_theta"]), convention="half", scaling=scaling)


def _from_llama_like(m) -> MultiHeadAttention:
    """``LlamaAttention`` and its copies: separate Q/K/V/O Linears, half-split RoPE, GQA via ``repeat_kv``."""
    config, name = m.config, type(m).__name__
    window = getattr(m, "sliding_window", None)  # Qwen2: per layer
    if window is None and name == "MistralAttention":
        window = getattr(config, "sliding_window", None)
    if window is not None:
        raise ValueError(
            f"config.sliding_window={window!r}: {name} with sliding-window attention is not supported "
            f"(headwise attends to every earlier key; a config with sliding_window=None converts)"
        )
    head_dim = int(m.head_dim)
    num_heads = _heads(m.q_proj.out_features, head_dim, "q_proj")
    num_kv_heads = _heads(m.k_proj.out_features, head_dim, "k_proj")
    projections = (m.q_proj, m.k_proj, m.v_proj, m.o_proj)
    return _build(
        like=m.q_proj.weight,
        d_model=m.q_proj.in_features,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        weights=tuple(p.weight for p in projections),
        biases=tuple(p.bias for p in projections),
        dropout=getattr(m, "attention_dropout", 0.0),
        scale=float(getattr(m, "scaling", head_dim**-0.5)),
        positional=_rope_from_config(config, head_dim),
    )


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
    "GPT2Attention": _from_gpt2,
    "BertAttention": _from_bert,
}
