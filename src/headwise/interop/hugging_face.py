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

Every conversion is checked before it is returned (:func:`_verify`): float64 copies of the source and of the
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
Importing this file does not import ``transformers``.
"""

from __future__ import annotations

import contextlib
import copy
import math

import torch
from torch import Tensor, nn

from headwise.core.attention import MultiHeadAttention
from headwise.core.latent import LatentAttention
from headwise.positional.rope import RotaryEmbedding, rope_angles

LAYOUTS = (
    "q_proj/k_proj/v_proj/o_proj (LlamaAttention and the families built like it)",
    "kv_a_proj_with_mqa/kv_b_proj (DeepseekV3Attention)",
    "Conv1D c_attn/c_proj (GPT2Attention)",
    "self.query/key/value with output.dense (BertAttention)",
)
ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # what headwise's RotaryEmbedding(scaling=...) computes
_ROPE_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
}
_YARN_OPTIONAL = ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate")
PROBE_TOL = 1e-4  # relative: Hugging Face's eager path takes the softmax (and some norms) in float32


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
    reader = _reader(module)
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
    _verify(module, out)
    out.train(module.training)
    return out


def _reader(m) -> object | None:
    """The converter for ``m``'s layout, or None."""
    if not isinstance(m, nn.Module):
        return None

    def has(*names, kind=nn.Module):
        return all(isinstance(getattr(m, n, None), kind) for n in names)

    if has("kv_a_proj_with_mqa", "kv_b_proj", "o_proj") and hasattr(m, "config"):
        return _from_latent
    if has("c_attn", "c_proj") and hasattr(m, "num_heads"):
        return _from_gpt2
    inner, output = getattr(m, "self", None), getattr(m, "output", None)
    if (
        isinstance(inner, nn.Module)
        and all(isinstance(getattr(inner, n, None), nn.Linear) for n in ("query", "key", "value"))
        and isinstance(getattr(output, "dense", None), nn.Linear)
    ):
        return _from_bert
    if has("q_proj", "k_proj", "v_proj", "o_proj", kind=nn.Linear) and hasattr(m, "config"):
        return _from_separate_projections
    return None


def _refuse(m, kind: str, detail: str) -> ValueError:
    return ValueError(f"{detail}: {type(m).__name__} uses {kind}, which headwise does not compute")


# -- shared pieces -----------------------------------------------------------------------------------------


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


# -- rotary embeddings from the config ---------------------------------------------------------------------


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
    m, config, head_dim: int, *, layer_type: str | None = None, convention: str = "half"
) -> RotaryEmbedding:
    cls = type(m).__name__
    params, where = _rope_parameters(config, layer_type)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(
            f"{where}: {cls} rotates with rope_type {kind!r}, which headwise does not compute "
            f"(supported: {', '.join(ROPE_TYPES)})"
        )
    partial = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    if partial is not None and float(partial) != 1.0:
        raise _refuse(m, "partial rotary embeddings", f"{where}: partial_rotary_factor={partial!r}")
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


# -- q_proj, k_proj, v_proj, o_proj: Llama and the families built like it ----------------------------------


def _layer_type(m, config) -> str | None:
    """The layer's type as the model reads it to pick the layer's mask and rotary tables: ``config.layer_types``
    at the module's ``layer_idx`` (Gemma 2/3, Qwen2/3, GPT-OSS, Cohere 2, EXAONE 4, OLMo 3), else the module's own
    ``layer_type``, else None (every layer alike)."""
    types, idx = getattr(config, "layer_types", None), getattr(m, "layer_idx", None)
    if types is not None and idx is not None and 0 <= idx < len(types):
        return types[idx]
    return getattr(m, "layer_type", None)


def _window(m, config) -> int | None:
    """The layer's sliding window, as the model builds its mask: by the layer's type in ``config.layer_types``
    where the config has them (a module's own ``sliding_window`` may be the config's on every layer, as EXAONE
    4's is, though its full-attention layers get the full causal mask), else the module's own (the config's
    window when the module has none and the config uses one: Mistral, Starcoder2)."""
    layer_type = _layer_type(m, config)
    if getattr(config, "layer_types", None) is not None and layer_type is not None:
        return getattr(config, "sliding_window", None) if layer_type == "sliding_attention" else None
    if hasattr(m, "sliding_window"):
        return m.sliding_window
    if getattr(config, "use_sliding_window", True) is False:
        return None
    return getattr(config, "sliding_window", None)


def _check_kinds(m, config) -> None:
    """Refuse, by name, the kinds of the families built like Llama that headwise does not compute."""
    if getattr(m, "is_causal", True) is False:
        what = (
            "config.use_bidirectional_attention=True"
            if getattr(config, "use_bidirectional_attention", False)
            else "is_causal=False"
        )
        raise ValueError(
            f"{what}: {type(m).__name__} attending both ways is not supported "
            "(headwise converts the causal decoders; expected False)"
        )
    if getattr(config, "clip_qkv", None) is not None:
        raise _refuse(m, "clipped queries, keys and values", f"config.clip_qkv={config.clip_qkv!r}")
    if getattr(config, "attention_chunk_size", None) is not None:
        raise _refuse(m, "chunked attention", f"config.attention_chunk_size={config.attention_chunk_size!r}")
    if getattr(m, "attn_temperature_tuning", False) or getattr(config, "attn_temperature_tuning", False):
        raise _refuse(m, "attention-temperature tuning", "config.attn_temperature_tuning=True")


def _rms_weight(m, name: str, norm: nn.Module, probe_norm: nn.Module) -> tuple[Tensor, float]:
    """The weight and eps of an RMSNorm, whatever its family multiplies by: ``weight`` (Qwen3, OLMo 2) or
    ``1 + weight`` (Gemma 3) — told apart by running the float64 copy ``probe_norm`` on two random rows."""
    eps = float(getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", None) or 1e-6)
    weight = getattr(norm, "weight", None)
    kind = f"a {name} that is not an RMSNorm times a weight"
    if not isinstance(weight, Tensor) or weight.dim() != 1:
        raise _refuse(m, kind, f"{name}: {type(norm).__name__}")
    x = torch.randn(2, weight.shape[0], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        measured = probe_norm(x) / (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))  # (2, width)
    w = weight.detach().to(torch.float64).cpu()
    for offset in (0.0, 1.0):
        if torch.allclose(measured, (w + offset).expand_as(measured), rtol=1e-5, atol=1e-6):
            return weight.detach() + offset, eps
    raise _refuse(m, kind, f"{name}: {type(norm).__name__}")


def _from_separate_projections(m) -> MultiHeadAttention:
    """Separate Q/K/V/O Linears, GQA via ``repeat_kv``, RoPE, and each family's kinds — a sliding window,
    soft-capping, sinks, QK-norm — read from the module and its config; the RoPE layout (and whether this
    layer rotates at all) from one probe of the module's forward."""
    config = m.config
    _check_kinds(m, config)
    head_dim = int(getattr(m, "head_dim", None) or m.q_proj.out_features // config.num_attention_heads)
    probe = _probe_copy(m)
    qn, kn = (
        None if isinstance(n, nn.Identity) else n for n in (getattr(m, "q_norm", None), getattr(m, "k_norm", None))
    )
    qk_norm, norms, eps = None, None, 1e-6
    if qn is not None or kn is not None:
        if qn is None or kn is None:
            raise _refuse(m, "a norm on only one of queries and keys", "q_norm/k_norm")
        (q_w, eps), (k_w, k_eps) = (
            _rms_weight(m, "q_norm", qn, probe.q_norm),
            _rms_weight(m, "k_norm", kn, probe.k_norm),
        )
        if eps != k_eps:
            raise _refuse(m, "q_norm and k_norm with different eps", f"q_norm eps={eps}, k_norm eps={k_eps}")
        qk_norm, norms = ("head" if q_w.shape[0] == head_dim else "full"), (q_w, k_w)
    softcap = getattr(m, "attn_logit_softcapping", None)
    if softcap is None:
        softcap = getattr(config, "attn_logit_softcapping", None)
    sinks = getattr(m, "sinks", None)

    def build(like_module, rope, window=None) -> MultiHeadAttention:
        p = (like_module.q_proj, like_module.k_proj, like_module.v_proj, like_module.o_proj)
        mha = _build(
            like=like_module.q_proj.weight,
            d_model=like_module.q_proj.in_features,
            num_heads=_heads(like_module.q_proj.out_features, head_dim, "q_proj"),
            num_kv_heads=_heads(like_module.k_proj.out_features, head_dim, "k_proj"),
            head_dim=head_dim,
            weights=tuple(x.weight for x in p),
            biases=tuple(x.bias for x in p),
            dropout=getattr(m, "attention_dropout", 0.0),
            scale=float(getattr(m, "scaling", head_dim**-0.5)),
            positional=rope,
            sliding_window=window,
            softcap=softcap,
            sinks=sinks is not None,
            qk_norm=qk_norm,
            norm_eps=eps,
        )
        with torch.no_grad():
            if sinks is not None:
                mha.sinks.copy_(like_module.sinks)
            if norms is not None:
                mha.q_norm.weight.copy_(norms[0])
                mha.k_norm.weight.copy_(norms[1])
        return mha

    layer_type = _layer_type(m, config)
    _rope_from_config(m, config, head_dim, layer_type=layer_type)  # refuses what headwise cannot rotate by name
    convention = _probe_rotation(m, probe, build(probe, None), head_dim)
    rope = None
    if convention is not None:
        rope = _rope_from_config(m, config, head_dim, layer_type=layer_type, convention=convention)
    return build(m, rope, window=_window(m, config))


def _probe_rotation(m, probe: nn.Module, mine: MultiHeadAttention, head_dim: int) -> str | None:
    """How the layer rotates queries and keys: ``"half"``, ``"interleaved"`` or None (it does not).

    The float64 copy ``probe`` of the module runs its own forward (eager attention, no mask) on random hidden
    states with ``position_embeddings`` laid out for each candidate, beside ``mine`` (the headwise module
    with the same weights) carrying that candidate; the candidate whose outputs agree is the answer.

    Raises:
        ValueError: no candidate agrees — the module computes something more (the message names it).
    """
    L = 6
    x = torch.randn(1, L, probe.q_proj.in_features, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    positions = torch.arange(L)
    rope_probe = {c: RotaryEmbedding(head_dim, base=100.0, convention=c) for c in ("half", "interleaved")}
    full, halved, interleaved = _tables(*rope_angles(positions, rope_probe["half"].inv_freq))
    candidates = [  # (convention of mine, cos and sin as the family's rotary embedding would hand them over)
        ("half", full),
        ("half", halved),
        ("interleaved", interleaved),
        (None, full),  # real angles handed over, none applied by mine
        (None, halved),
    ]
    errors, failure = {}, None
    for convention, (cos, sin) in candidates:
        mine.positional = None if convention is None else rope_probe[convention].to(torch.float64)
        with torch.no_grad():
            try:
                theirs = probe(hidden_states=x, position_embeddings=(cos, sin), attention_mask=None)
            except Exception as e:  # these tables do not fit this family's rotation (or its forward)
                failure = e
                continue
            theirs = theirs[0] if isinstance(theirs, tuple) else theirs
            got = mine(x)[0]
        err = _relative(got, theirs)
        errors[convention] = min(err, errors.get(convention, math.inf))
    if not errors:
        raise _refuse(
            m, "a forward headwise cannot probe", f"module: {type(m).__name__}(hidden_states, position_embeddings)"
        ) from failure
    best = min(errors, key=errors.get)
    if errors[best] > PROBE_TOL:
        raise _refuse(
            m,
            "something beyond headwise's MultiHeadAttention",
            f"module: on a probe, the nearest headwise module (RoPE {best or 'none'}) differs by "
            f"{errors[best]:.1e} relative",
        )
    return best


def _tables(c: Tensor, s: Tensor) -> tuple[tuple[Tensor, Tensor], ...]:
    """``cos, sin (L, Dh/2)`` as the families' rotary embeddings hand them to their layers: Llama's ``cat``
    ``(1, L, Dh)``, GPT-OSS's half width ``(1, L, Dh/2)``, Cohere's ``repeat_interleave`` ``(1, L, Dh)``."""
    return (
        (torch.cat([c, c], -1)[None], torch.cat([s, s], -1)[None]),
        (c[None], s[None]),
        (c.repeat_interleave(2, -1)[None], s.repeat_interleave(2, -1)[None]),
    )


# -- every converted layer checked against its source ------------------------------------------------------

#: Tokens of the check every converted layer passes (longer than a tiny test model's window of 4).
CHECK_TOKENS = 8
_RECORDING = "headwise_interop_recording"  # the attention function that records what a module asks of it


def _relative(got: Tensor, want: Tensor) -> float:
    """The largest absolute difference relative to the largest absolute value of ``want``."""
    return ((got - want).abs().max() / want.abs().max().clamp(min=1e-30)).item()


def _probe_copy(m: nn.Module) -> nn.Module:
    """A float64 CPU copy of ``m`` in eval mode, on eager attention, without the caller's hooks (a capture, a
    probe must not see the probe's call). Costs one copy of the layer's weights in float64."""
    probe = copy.deepcopy(m).to(device="cpu", dtype=torch.float64).eval()
    for sub in probe.modules():
        sub._forward_hooks.clear()
        sub._forward_pre_hooks.clear()
        if getattr(sub, "config", None) is not None:
            sub.config._attn_implementation = "eager"  # the copy's own config, not the caller's
    return probe


def _family_rotary(m, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor] | None:
    """``(cos, sin)`` as the model hands them to layer ``m``: from the one rotary embedding class defined in the
    module's own modeling file, built from its config (per layer type where it takes one); None where the file
    has none, or not exactly one, or it does not build from the config alone."""
    import inspect
    import sys

    source = sys.modules.get(type(m).__module__)
    classes = [
        v
        for k, v in vars(source or object()).items()
        if k.endswith("RotaryEmbedding") and isinstance(v, type) and v.__module__ == type(m).__module__
    ]
    if len(classes) != 1:
        return None
    try:
        rotary = classes[0](m.config)
    except Exception:
        return None
    kwargs = {}
    if "layer_type" in inspect.signature(rotary.forward).parameters:
        kwargs["layer_type"] = _layer_type(m, m.config)
    with torch.no_grad():
        return rotary(x, positions[None], **kwargs)


def _verify(m, mine) -> None:
    """Refuse a conversion whose module does not compute what ``m`` computes, on one probe.

    A float64 copy of ``m`` (eager attention, no dropout) and a float64 copy of ``mine`` run on the same
    :data:`CHECK_TOKENS` random hidden states — causal with the layer's window where the source is a decoder;
    the rotary tables those of the family's own rotary embedding at positions ``0 … L−1`` (else headwise's, laid
    out as the family's layers take them); random encoder states for cross-attention — and must agree within
    :data:`PROBE_TOL` relative; and the ``sliding_window`` a RoPE decoder hands its attention function
    (:func:`_asked_window`) must be the converted module's — a window longer than the probe is seen there only.
    Costs two float64 copies of the layer's weights for the time of the call and three forwards of at most
    :data:`CHECK_TOKENS` tokens, no gradient.

    Raises:
        ValueError: the outputs or the windows differ; the message names the layer, the family and the difference.
    """
    probe = _probe_copy(m)
    ours = copy.deepcopy(mine).to(device="cpu", dtype=torch.float64).eval()
    L, reader = CHECK_TOKENS, _reader(m)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, L, ours.Wo.out_features, generator=g, dtype=torch.float64)
    cross = getattr(m, "is_cross_attention", False) or getattr(getattr(m, "self", None), "is_cross_attention", False)
    causal = reader is not _from_bert or bool(getattr(m.self, "is_causal", False))  # BERT: as a decoder
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    blocked = (j > i) if causal else torch.zeros(L, L, dtype=torch.bool)
    window = getattr(ours, "sliding_window", None)
    if window is not None:
        blocked |= i - j >= window  # Hugging Face's sliding window: keys with q - k < window stay visible
    mask = torch.zeros(1, 1, L, L, dtype=torch.float64).masked_fill(blocked, torch.finfo(torch.float64).min)
    with torch.no_grad():
        if cross:
            enc = torch.randn(1, 5, ours.Wk.in_features, generator=g, dtype=torch.float64)
            got = ours(x, enc, enc)[0]
            if reader is _from_bert:
                theirs = probe.output.dense(probe.self(x, encoder_hidden_states=enc)[0])
            else:
                theirs = probe(x, encoder_hidden_states=enc)[0]
        elif reader is _from_bert:
            theirs = probe.output.dense(probe.self(x, attention_mask=mask if causal else None)[0])
            got = ours(x, is_causal=causal)[0]
        elif reader is _from_gpt2:
            theirs, got = probe(x, attention_mask=mask)[0], ours(x, is_causal=True)[0]
        else:  # the RoPE decoders: the model's own tables, else headwise's in each layout a family takes
            positions = torch.arange(L)
            layouts = [_family_rotary(m, x, positions)]
            if layouts[0] is None:
                rope = ours.positional or RotaryEmbedding(ours.head_dim)  # a layer without RoPE ignores them
                cos, sin = rope_angles(positions, rope.inv_freq)  # (L, Dh/2) each
                layouts = _tables(cos * rope.attention_factor, sin * rope.attention_factor)
            found = []
            for tables in layouts:
                with contextlib.suppress(Exception):  # tables this family does not take
                    out = probe(hidden_states=x, position_embeddings=tables, attention_mask=mask)
                    found.append((out[0] if isinstance(out, tuple) else out, ours(x, is_causal=True)[0], tables))
            if not found:
                raise _refuse(m, "a forward headwise cannot probe", f"module: {type(m).__name__}")
            theirs, got, tables = min(found, key=lambda f: (f[0] - f[1]).abs().max().item())
            if reader is _from_separate_projections:
                asked = _asked_window(probe, x, tables)
                if asked is not None and asked != (window,):
                    raise _differs(
                        m,
                        mine,
                        f"the module asks its attention for sliding_window={asked[0]!r}, the "
                        f"converted module has sliding_window={window!r}",
                    )
    err = _relative(got, theirs)
    if not err <= PROBE_TOL:
        raise _differs(m, mine, f"its output differs by {err:.1e} relative (tolerance {PROBE_TOL:.0e}) on {L} tokens")


def _differs(m, mine, what: str) -> ValueError:
    """The refusal of a conversion that the check found different from its source: layer, family, difference."""
    inner = getattr(m, "self", None)  # BERT's layer index and config sit on its self-attention
    config = getattr(m, "config", None) or getattr(inner, "config", None)
    family = getattr(config, "model_type", None) or type(m).__module__
    index = getattr(m, "layer_idx", getattr(inner, "layer_idx", None))
    return ValueError(
        f"module: layer {index} of {family} ({type(m).__name__}) converted to a {type(mine).__name__} that "
        f"differs from it — {what}; refused, headwise does not reproduce this layer"
    )


def _asked_window(probe: nn.Module, x: Tensor, tables: tuple[Tensor, Tensor]) -> tuple[int | None] | None:
    """``(window,)``: the ``sliding_window`` the module hands its attention function — the window transformers'
    flash and SDPA paths apply, read beside the masks its model builds — or None where it hands none over.
    One call of the probe copy on two tokens through a recording attention function (registered in
    transformers' ``AttentionInterface`` under a private name; the copy's config switches to it and back)."""
    from transformers import AttentionInterface

    seen = {}

    def record(module, query, key, value, attention_mask, **kwargs):  # (B, H, L, Dh) -> (B, L, H, Dh) zeros
        seen.update(kwargs)
        return query.new_zeros(query.shape[0], query.shape[2], query.shape[1], value.shape[-1]), None

    AttentionInterface.register(_RECORDING, record)
    config = probe.config
    config._attn_implementation = _RECORDING
    try:
        probe(hidden_states=x[:, :2], position_embeddings=tuple(t[:, :2] for t in tables), attention_mask=None)
    finally:
        config._attn_implementation = "eager"
    return (seen["sliding_window"],) if "sliding_window" in seen else None


# -- kv_a_proj_with_mqa, kv_b_proj: DeepSeek-V3 latent attention -------------------------------------------


def _from_latent(m) -> LatentAttention:
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
            m,
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


# -- c_attn, c_proj: GPT-2 ---------------------------------------------------------------------------------


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


# -- self.query/key/value, output.dense: BERT --------------------------------------------------------------


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
