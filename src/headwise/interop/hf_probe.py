"""Probes of a Hugging Face attention module for :func:`headwise.interop.from_hf`: the rotary layout a layer
rotates by (:func:`probe_rotation`) and the check every converted layer passes against its source
(:func:`verify`: float64 copies on :data:`CHECK_TOKENS` random hidden states within :data:`PROBE_TOL`, and the
``sliding_window`` the module hands its attention function).

Shape legend: L probe length, D model width, Dh head width.
"""

from __future__ import annotations

import contextlib
import copy
import math

import torch
from torch import Tensor, nn

from headwise.core.attention import MultiHeadAttention
from headwise.interop.hf_config import layer_type_of, refuse
from headwise.positional.rope import RotaryEmbedding, rope_angles

__all__ = ["CHECK_TOKENS", "PROBE_TOL", "probe_copy", "probe_rotation", "verify"]

PROBE_TOL = 1e-4  # relative: Hugging Face's eager path takes the softmax (and some norms) in float32
#: Tokens of the check every converted layer passes (longer than a tiny test model's window of 4).
CHECK_TOKENS = 8
RECORDING = "headwise_interop_recording"  # the attention function that records what a module asks of it


def probe_rotation(m, probe: nn.Module, mine: MultiHeadAttention, head_dim: int) -> str | None:
    """How the layer rotates queries and keys: one of :data:`headwise.positional.rope.CONVENTIONS` (``"half"``,
    ``"interleaved"``) or None (it does not).

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
    full, halved, interleaved = rotary_tables(*rope_angles(positions, rope_probe["half"].inv_freq))
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
        err = relative_error(got, theirs)
        errors[convention] = min(err, errors.get(convention, math.inf))
    if not errors:
        raise refuse(
            m, "a forward headwise cannot probe", f"module: {type(m).__name__}(hidden_states, position_embeddings)"
        ) from failure
    best = min(errors, key=errors.get)
    if errors[best] > PROBE_TOL:
        raise refuse(
            m,
            "something beyond headwise's MultiHeadAttention",
            f"module: on a probe, the nearest headwise module (RoPE {best or 'none'}) differs by "
            f"{errors[best]:.1e} relative",
        )
    return best


def rotary_tables(c: Tensor, s: Tensor) -> tuple[tuple[Tensor, Tensor], ...]:
    """``cos, sin (L, Dh/2)`` as the families' rotary embeddings hand them to their layers, in the order of
    :data:`headwise.models.rotation.TABLES` (the anatomy's names for them): ``"full"``, Llama's ``cat`` ``(1, L,
    Dh)``; ``"halved"``, GPT-OSS's half width ``(1, L, Dh/2)``; ``"interleaved"``, Cohere's ``repeat_interleave``
    ``(1, L, Dh)``."""
    return (
        (torch.cat([c, c], -1)[None], torch.cat([s, s], -1)[None]),
        (c[None], s[None]),
        (c.repeat_interleave(2, -1)[None], s.repeat_interleave(2, -1)[None]),
    )


# -- every converted layer checked against its source ------------------------------------------------------


def relative_error(got: Tensor, want: Tensor) -> float:
    """The largest absolute difference relative to the largest absolute value of ``want``."""
    return ((got - want).abs().max() / want.abs().max().clamp(min=1e-30)).item()


def probe_copy(m: nn.Module) -> nn.Module:
    """A float64 CPU copy of ``m`` in eval mode, on eager attention, without the caller's hooks (a capture, a
    probe must not see the probe's call). Costs one copy of the layer's weights in float64."""
    probe = copy.deepcopy(m).to(device="cpu", dtype=torch.float64).eval()
    for sub in probe.modules():
        sub._forward_hooks.clear()
        sub._forward_pre_hooks.clear()
        if getattr(sub, "config", None) is not None:
            sub.config._attn_implementation = "eager"  # the copy's own config, not the caller's
    return probe


def family_rotary(m, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor] | None:
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
        kwargs["layer_type"] = layer_type_of(m, m.config)
    with torch.no_grad():
        return rotary(x, positions[None], **kwargs)


def verify(m, mine, layout: str) -> None:
    """Refuse a conversion whose module does not compute what ``m`` computes, on one probe.

    A float64 copy of ``m`` (eager attention, no dropout) and a float64 copy of ``mine`` run on the same
    :data:`CHECK_TOKENS` random hidden states — causal with the layer's window where the source is a decoder;
    the rotary tables those of the family's own rotary embedding at positions ``0 … L−1`` (else headwise's, laid
    out as the family's layers take them); random encoder states for cross-attention — and must agree within
    :data:`PROBE_TOL` relative; and the ``sliding_window`` a RoPE decoder hands its attention function
    (:func:`asked_window`) must be the converted module's — a window longer than the probe is seen there only.
    Costs two float64 copies of the layer's weights for the time of the call and three forwards of at most
    :data:`CHECK_TOKENS` tokens, no gradient.

    ``layout``: the reader's (``"projections"``, ``"latent"``, ``"gpt2"``, ``"bert"``: see
    :func:`headwise.interop.hugging_face.from_hf`).

    Raises:
        ValueError: the outputs or the windows differ; the message names the layer, the family and the difference.
    """
    probe = probe_copy(m)
    ours = copy.deepcopy(mine).to(device="cpu", dtype=torch.float64).eval()
    L = CHECK_TOKENS
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, L, ours.Wo.out_features, generator=g, dtype=torch.float64)
    cross = getattr(m, "is_cross_attention", False) or getattr(getattr(m, "self", None), "is_cross_attention", False)
    causal = layout != "bert" or bool(getattr(m.self, "is_causal", False))  # BERT: as a decoder
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
            if layout == "bert":
                theirs = probe.output.dense(probe.self(x, encoder_hidden_states=enc)[0])
            else:
                theirs = probe(x, encoder_hidden_states=enc)[0]
        elif layout == "bert":
            theirs = probe.output.dense(probe.self(x, attention_mask=mask if causal else None)[0])
            got = ours(x, is_causal=causal)[0]
        elif layout == "gpt2":
            theirs, got = probe(x, attention_mask=mask)[0], ours(x, is_causal=True)[0]
        else:  # the RoPE decoders: the model's own tables, else headwise's in each layout a family takes
            positions = torch.arange(L)
            layouts = [family_rotary(m, x, positions)]
            if layouts[0] is None:
                rope = ours.positional or RotaryEmbedding(ours.head_dim)  # a layer without RoPE ignores them
                cos, sin = rope_angles(positions, rope.inv_freq)  # (L, Dh/2) each
                layouts = rotary_tables(cos * rope.attention_factor, sin * rope.attention_factor)
            found = []
            for tables in layouts:
                with contextlib.suppress(Exception):  # tables this family does not take
                    out = probe(hidden_states=x, position_embeddings=tables, attention_mask=mask)
                    found.append((out[0] if isinstance(out, tuple) else out, ours(x, is_causal=True)[0], tables))
            if not found:
                raise refuse(m, "a forward headwise cannot probe", f"module: {type(m).__name__}")
            theirs, got, tables = min(found, key=lambda f: (f[0] - f[1]).abs().max().item())
            if layout == "projections":
                asked = asked_window(probe, x, tables)
                if asked is not None and asked != (window,):
                    raise differs(
                        m,
                        mine,
                        f"the module asks its attention for sliding_window={asked[0]!r}, the "
                        f"converted module has sliding_window={window!r}",
                    )
    err = relative_error(got, theirs)
    if not err <= PROBE_TOL:
        raise differs(m, mine, f"its output differs by {err:.1e} relative (tolerance {PROBE_TOL:.0e}) on {L} tokens")


def differs(m, mine, what: str) -> ValueError:
    """The refusal of a conversion that the check found different from its source: layer, family, difference."""
    inner = getattr(m, "self", None)  # BERT's layer index and config sit on its self-attention
    config = getattr(m, "config", None) or getattr(inner, "config", None)
    family = getattr(config, "model_type", None) or type(m).__module__
    index = getattr(m, "layer_idx", getattr(inner, "layer_idx", None))
    return ValueError(
        f"module: layer {index} of {family} ({type(m).__name__}) converted to a {type(mine).__name__} that "
        f"differs from it — {what}; refused, headwise does not reproduce this layer"
    )


def asked_window(probe: nn.Module, x: Tensor, tables: tuple[Tensor, Tensor]) -> tuple[int | None] | None:
    """``(window,)``: the ``sliding_window`` the module hands its attention function — the window transformers'
    flash and SDPA paths apply, read beside the masks its model builds — or None where it hands none over.
    One call of the probe copy on two tokens through a recording attention function (registered in
    transformers' ``AttentionInterface`` under a private name; the copy's config switches to it and back)."""
    from transformers import AttentionInterface

    seen = {}

    def record(module, query, key, value, attention_mask, **kwargs):  # (B, H, L, Dh) -> (B, L, H, Dh) zeros
        seen.update(kwargs)
        return query.new_zeros(query.shape[0], query.shape[2], query.shape[1], value.shape[-1]), None

    AttentionInterface.register(RECORDING, record)
    config = probe.config
    config._attn_implementation = RECORDING
    try:
        probe(hidden_states=x[:, :2], position_embeddings=tuple(t[:, :2] for t in tables), attention_mask=None)
    finally:
        config._attn_implementation = "eager"
    return (seen["sliding_window"],) if "sliding_window" in seen else None


# -- kv_a_proj_with_mqa, kv_b_proj: DeepSeek-V3 latent attention -------------------------------------------
