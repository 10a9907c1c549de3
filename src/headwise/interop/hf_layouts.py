"""The readers of :func:`headwise.interop.from_hf`, one per layout of a Hugging Face attention module: separate
``q_proj / k_proj / v_proj / o_proj`` (Llama and the families built like it), DeepSeek-V3's latent attention,
GPT-2's fused ``Conv1D`` and BERT's ``self.query / key / value`` with ``output.dense`` — each reads the weights
and the configuration (:mod:`headwise.interop.hf_config`) into a headwise module.

Shape legend: D model width, H query heads, Hkv key/value heads, Dh head width.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from headwise.core.attention import MultiHeadAttention
from headwise.core.latent import LatentAttention
from headwise.interop.hf_config import check_kinds, head_count, layer_type_of, refuse, rope_from_config, window_of
from headwise.interop.hf_probe import probe_copy, probe_rotation

__all__ = ["build_module", "from_bert", "from_gpt2", "from_latent", "from_separate_projections", "rms_weight"]

# -- shared pieces -----------------------------------------------------------------------------------------


def build_module(
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


def rms_weight(m, name: str, norm: nn.Module, probe_norm: nn.Module) -> tuple[Tensor, float]:
    """The weight and eps of an RMSNorm, whatever its family multiplies by: ``weight`` (Qwen3, OLMo 2) or
    ``1 + weight`` (Gemma 3) — told apart by running the float64 copy ``probe_norm`` on two random rows."""
    eps = float(getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", None) or 1e-6)
    weight = getattr(norm, "weight", None)
    kind = f"a {name} that is not an RMSNorm times a weight"
    if not isinstance(weight, Tensor) or weight.dim() != 1:
        raise refuse(m, kind, f"{name}: {type(norm).__name__}")
    x = torch.randn(2, weight.shape[0], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        measured = probe_norm(x) / (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))  # (2, width)
    w = weight.detach().to(torch.float64).cpu()
    for offset in (0.0, 1.0):
        if torch.allclose(measured, (w + offset).expand_as(measured), rtol=1e-5, atol=1e-6):
            return weight.detach() + offset, eps
    raise refuse(m, kind, f"{name}: {type(norm).__name__}")


def from_separate_projections(m) -> MultiHeadAttention:
    """Separate Q/K/V/O Linears, GQA via ``repeat_kv``, RoPE, and each family's kinds — a sliding window,
    soft-capping, sinks, QK-norm — read from the module and its config; the RoPE layout (and whether this
    layer rotates at all) from one probe of the module's forward."""
    config = m.config
    check_kinds(m, config)
    head_dim = int(getattr(m, "head_dim", None) or m.q_proj.out_features // config.num_attention_heads)
    probe = probe_copy(m)
    qn, kn = (
        None if isinstance(n, nn.Identity) else n for n in (getattr(m, "q_norm", None), getattr(m, "k_norm", None))
    )
    qk_norm, norms, eps = None, None, 1e-6
    if qn is not None or kn is not None:
        if qn is None or kn is None:
            raise refuse(m, "a norm on only one of queries and keys", "q_norm/k_norm")
        (q_w, eps), (k_w, k_eps) = (
            rms_weight(m, "q_norm", qn, probe.q_norm),
            rms_weight(m, "k_norm", kn, probe.k_norm),
        )
        if eps != k_eps:
            raise refuse(m, "q_norm and k_norm with different eps", f"q_norm eps={eps}, k_norm eps={k_eps}")
        qk_norm, norms = ("head" if q_w.shape[0] == head_dim else "full"), (q_w, k_w)
    softcap = getattr(m, "attn_logit_softcapping", None)
    if softcap is None:
        softcap = getattr(config, "attn_logit_softcapping", None)
    sinks = getattr(m, "sinks", None)

    def build(like_module, rope, window=None) -> MultiHeadAttention:
        p = (like_module.q_proj, like_module.k_proj, like_module.v_proj, like_module.o_proj)
        mha = build_module(
            like=like_module.q_proj.weight,
            d_model=like_module.q_proj.in_features,
            num_heads=head_count(like_module.q_proj.out_features, head_dim, "q_proj"),
            num_kv_heads=head_count(like_module.k_proj.out_features, head_dim, "k_proj"),
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

    layer_type = layer_type_of(m, config)
    rope_from_config(m, config, head_dim, layer_type=layer_type)  # refuses what headwise cannot rotate by name
    convention = probe_rotation(m, probe, build(probe, None), head_dim)
    rope = None
    if convention is not None:
        rope = rope_from_config(m, config, head_dim, layer_type=layer_type, convention=convention)
    return build(m, rope, window=window_of(m, config))


def from_latent(m) -> LatentAttention:
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
        positional=rope_from_config(
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


def from_gpt2(m) -> MultiHeadAttention:
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
    return build_module(
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


def from_bert(m) -> MultiHeadAttention:
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
    return build_module(
        like=s.query.weight,
        d_model=s.query.in_features,
        num_heads=head_count(s.query.out_features, dh, "self.query"),
        num_kv_heads=head_count(s.key.out_features, dh, "self.key"),
        head_dim=dh,
        weights=tuple(p.weight for p in projections),
        biases=tuple(p.bias for p in projections),
        dropout=s.dropout.p,
        scale=float(getattr(s, "scaling", dh**-0.5)),
        kdim=s.key.in_features,
        vdim=s.value.in_features,
    )
