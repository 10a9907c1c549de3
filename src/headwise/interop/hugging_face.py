"""Hugging Face attention modules into headwise's :class:`MultiHeadAttention` (or :class:`LatentAttention`).

``from_hf(module)`` reads one Hugging Face ``transformers`` attention module — its projections, its
configuration and, where the configuration is silent, one run of its own forward on a probe — and returns a
headwise module that computes the same function of the same hidden states. The family is never looked up by
class name; the module's layout picks the reader:

=========================================  ===============================================  ============================
layout (examples)                          read from the module and its config              call it as
=========================================  ===============================================  ============================
``q_proj, k_proj, v_proj, o_proj``         head counts, ``head_dim``, biases, ``scaling``,  ``mine(x, is_causal=True)``
(Llama, Mistral, Qwen2/3, Gemma 2/3,       the layer's sliding window (``layer_types``),
OLMo 2/3, Starcoder2, GPT-OSS, EXAONE 4)   RoPE base/scaling, its layout and whether the
                                           layer rotates at all (probed), QK-norm,
                                           soft-capping, sinks
``kv_a_proj_with_mqa, kv_b_proj``          latent attention -> :class:`LatentAttention`     ``mine(x, is_causal=True)``
(DeepSeek-V3)
``c_attn (D, 3D)``, ``c_proj`` (GPT-2)     fused ``Conv1D`` weights, transposed             ``mine(x, is_causal=True)``
``self.query/key/value``,                  ``output.dense`` as Wo                           with ``key_padding_mask``
``output.dense`` (BERT and its kin)
=========================================  ===============================================  ============================

What "the same output" means, per layout:

- The RoPE decoders: the attention module's first output (after ``o_proj``) for hidden states at positions
  ``0 … L−1`` (or the ``position_ids`` you pass, which must be those the model gave its rotary embedding).
  The rotary embedding lives in the *model* in Hugging Face (``LlamaRotaryEmbedding``, from the config's
  ``rope_parameters``, per layer type for Gemma 3); headwise carries it inside the converted module as a
  :class:`~headwise.positional.rope.RotaryEmbedding`. Its layout is the one the family's code rotates by —
  ``"half"`` (``rotate_half``, Llama) or ``"interleaved"`` (Cohere) — and a layer that does not rotate
  (Cohere 2's global layers) gets none; both are found by running the module's forward once, in float64 on
  a copy, against each candidate. DeepSeek-V3's ``rope_interleave`` rotates interleaved pairs and lays the
  result out by halves: the same scores as ``"interleaved"``. The masks Hugging Face builds in the model
  (causal, sliding window per layer type) are the converted module's own options: ``sliding_window`` where
  the layer has one.
- GPT-2: the module's first output after ``c_proj`` (and ``resid_dropout``, the identity in eval mode).
  GPT-2's learned positions are added to the embeddings before the block, so none are inside attention.
- BERT: ``BertAttention`` returns ``LayerNorm(dropout(dense(self_attention(x))) + x)``. headwise's module ends
  at the output projection, so ``from_hf(bert_attention)(x)`` equals ``bert_attention.output.dense`` applied
  to ``bert_attention.self(x)``; the residual and LayerNorm stay in the block around it
  (``bert_attention.output.LayerNorm(mine(x)[0] + x)`` is the whole ``BertAttention`` output in eval mode).

Every conversion is checked before it is returned (:func:`verify`): float64 copies of the source and of the
converted module run on :data:`CHECK_TOKENS` random hidden states with the mask the layer gets in its model and
the family's own rotary tables, and must agree within :data:`PROBE_TOL`; the ``sliding_window`` the module hands
its attention function must be the converted module's. What differs is refused, naming the layer, the family and
the difference — a converter may refuse, it may never be wrong. The layer's type (its window, its RoPE settings
in per-layer-type ``rope_parameters``: Gemma 3, OLMo 3) is read from ``config.layer_types`` as the model reads it.

What headwise cannot compute is refused with the module's class and the missing kind in the message:
partial rotary embeddings, RoPE types other than ``default``/``linear``/``llama3``/``yarn``, attention both
ways in a decoder, clipped Q/K/V (``clip_qkv``), chunked attention, attention-temperature tuning, a QK-norm
that is not an RMSNorm times a weight, GPT-2's ``reorder_and_upcast_attn``, BERT's relative positions — and
any module whose probed forward no headwise module reproduces.

The converted module keeps the attention-weight dropout probability and the ``training`` flag of the
source; GPT-2's ``resid_dropout`` and BERT's hidden dropout act outside attention and are not carried.
Importing this file does not import ``transformers``. The readers of each layout live in
:mod:`headwise.interop.hf_layouts`, what the configuration says in :mod:`headwise.interop.hf_config`, the probes and
the check in :mod:`headwise.interop.hf_probe`.
"""

from __future__ import annotations

from torch import nn

from headwise.core.attention import MultiHeadAttention
from headwise.core.latent import LatentAttention
from headwise.interop.hf_layouts import from_bert, from_gpt2, from_latent, from_separate_projections
from headwise.interop.hf_probe import verify

LAYOUTS = (
    "q_proj/k_proj/v_proj/o_proj (LlamaAttention and the families built like it)",
    "kv_a_proj_with_mqa/kv_b_proj (DeepseekV3Attention)",
    "Conv1D c_attn/c_proj (GPT2Attention)",
    "self.query/key/value with output.dense (BertAttention)",
)


def from_hf(module: nn.Module) -> MultiHeadAttention | LatentAttention:
    """A headwise module equal to a Hugging Face attention module.

    Args:
        module: a ``transformers`` attention module of one of the layouts in :data:`LAYOUTS` (see the module
            docstring for what is read and what is compared).
    Returns:
        A new module with copies of the weights, on the source's device and dtype, in its training mode: a
        :class:`MultiHeadAttention`, or a :class:`~headwise.core.latent.LatentAttention` for DeepSeek-V3.
        Call it with ``is_causal=True`` for the decoders and with ``key_padding_mask`` for BERT's padding.
    Raises:
        TypeError: ``module`` has none of the layouts (the message lists them).
        ValueError: a kind of attention headwise does not compute — named in the message with the module's
            class (see the module docstring).
    """
    cls = type(module)
    layout, reader = _reader(module)
    if reader is None:
        hint = ""
        if all(isinstance(getattr(module, n, None), nn.Linear) for n in ("query", "key", "value")):
            parent = cls.__name__.replace("SelfAttention", "Attention").replace("CrossAttention", "Attention")
            hint = f" (pass its parent {parent}: headwise needs output.dense as Wo)"
        raise TypeError(
            f"module: expected a Hugging Face attention module with one of the layouts {'; '.join(LAYOUTS)}; "
            f"got {cls.__module__}.{cls.__qualname__}{hint}"
        )
    out = reader(module)
    verify(module, out, layout)
    out.train(module.training)
    return out


def _reader(m) -> tuple[str | None, object | None]:
    """``(layout, the converter for it)`` of ``m``: ``"latent"``, ``"gpt2"``, ``"bert"`` or ``"projections"``
    (:mod:`headwise.interop.hf_layouts`), or ``(None, None)``."""
    if not isinstance(m, nn.Module):
        return None, None

    def has(*names, kind=nn.Module):
        return all(isinstance(getattr(m, n, None), kind) for n in names)

    if has("kv_a_proj_with_mqa", "kv_b_proj", "o_proj") and hasattr(m, "config"):
        return "latent", from_latent
    if has("c_attn", "c_proj") and hasattr(m, "num_heads"):
        return "gpt2", from_gpt2
    inner, output = getattr(m, "self", None), getattr(m, "output", None)
    if (
        isinstance(inner, nn.Module)
        and all(isinstance(getattr(inner, n, None), nn.Linear) for n in ("query", "key", "value"))
        and isinstance(getattr(output, "dense", None), nn.Linear)
    ):
        return "bert", from_bert
    if has("q_proj", "k_proj", "v_proj", "o_proj", kind=nn.Linear) and hasattr(m, "config"):
        return "projections", from_separate_projections
    return None, None
