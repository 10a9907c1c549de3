"""headwise as a Hugging Face ``transformers`` attention backend: ``attn_implementation="headwise"``.

transformers 5 lets a library register an attention function (``AttentionInterface.register``) and the
function that builds the masks it receives (``AttentionMaskInterface.register``). The model's attention
module projects, rotates and caches the keys, then calls::

    attention_forward(module, query (B, H, L, Dh), key (B, Hkv, S, Dh), value (B, Hkv, S, Dv),
                      attention_mask, **kwargs) -> (out (B, L, H, Dv), weights (B, H, L, S) or None)

and reshapes ``out`` to ``(B, L, H·Dv)`` for its output projection (``o_proj``, GPT-2's ``c_proj``, BERT's
``attention.output.dense``). Here the keywords become one :class:`~headwise.core.call.AttentionCall`, checked
once, and the call runs through the module's hook points (:func:`headwise.core.hooks.attend_hooked`, the same
step as headwise's own modules).

The mask. The mask function :func:`build_mask` is transformers' own ``sdpa_mask`` (registered under the same name, so a
model never builds a mask for an implementation that does not exist — which would silently drop causality):
a boolean ``(B, 1, L, S)`` with True = *may* attend, already holding causality, padding, sliding windows,
chunks and packed sequences, or None where ``F.scaled_dot_product_attention``'s own flags suffice (plain
causal with no padding: ``L == S``, or an empty cache; plain bidirectional with no padding). It is turned
into headwise's convention here (``blocked = ~mask``; a float mask is a ``bias``), the one place Hugging
Face masks are converted. A query row with every key blocked (a left-padding row) gets zero weights and
a zero output, where eager's finite ``finfo.min`` mask spreads it evenly over the padding.

The keyword arguments, each honoured or refused (``ValueError`` naming it), never dropped:

- ``scaling`` -> ``scale``; ``dropout`` -> ``dropout_p``; ``position_bias`` (T5-like) -> added to the scores.
- ``is_causal`` (or the module's own ``is_causal``, as the ``sdpa`` backend reads it): used when no mask
  arrives and ``L > 1``, top-left aligned as ``F.scaled_dot_product_attention`` (the mask function only
  returns None where that alignment is the right one); a single query with no mask sees every key.
- ``sliding_window`` W: in the mask whenever one arrives (``kv_idx > q_idx - W``, Mistral's convention);
  with no mask it goes to the functional as ``window`` (a single query: ``masks.causality`` after the
  cache); a non-causal call with no mask over more than W keys is refused.
- ``softcap`` (Gemma 2) -> ``softcap``; ``s_aux`` (GPT-OSS sinks, one logit per query head) -> ``sinks``.
- ``output_attentions``: the weights are returned (``need_weights=True``) — also for models loaded on
  headwise, unlike ``sdpa``.
- Accepted without effect, because the information is already in the tensors or the mask:
  ``position_ids``, ``position_embeddings``, ``cache_position``, ``use_cache``, ``encoder_hidden_states``
  (cross-attention keys are already projected), ``output_hidden_states``, ``output_router_logits``,
  ``num_items_in_batch``, ``return_dict``, ``token_type_ids``, ``deterministic`` (False only).
- Any other keyword whose value is not None (packed ``cu_seq_lens_*`` / ``max_length_*``, sparse ``indices``,
  ``sinks`` under another name …) is refused by name.

Shape legend: B batch, L query length, S key length (cached keys included), H query heads, Hkv key/value
heads, Dh query/key head width, Dv value head width.
"""

from __future__ import annotations

import inspect
import sys
from weakref import WeakKeyDictionary

import torch
from torch import Tensor, nn

from headwise.core import masks
from headwise.core.call import AttentionCall
from headwise.core.hooks import HookPoint, attend_hooked

NAME = "headwise"

# Keywords that carry no request the attention maths must honour: the information they hold is already in
# q, k, v (positions are rotated in, cross-attention keys projected) or in the mask (packing, padding).
_NO_EFFECT = frozenset(
    {
        "position_ids",
        "position_embeddings",
        "cache_position",
        "use_cache",
        "encoder_hidden_states",
        "encoder_attention_mask",
        "output_hidden_states",
        "output_router_logits",
        "num_items_in_batch",
        "return_dict",
        "token_type_ids",
        "layer_idx",
    }
)
# -- hook points: gates, ablation and capture act here, one pair per attention module --------------------------


class AttentionHooks(nn.Module):
    """The two :class:`~headwise.core.hooks.HookPoint` s of one Hugging Face attention module, named as on
    headwise's own :class:`~headwise.core.attention.MultiHeadAttention`.

    Attributes:
        hook_heads: the per-head outputs ``(B, H, L, Dv)`` before the model merges the heads for its output
            projection (``o_proj``, GPT-2's ``c_proj``, BERT's ``attention.output.dense``); a hook may replace them.
        hook_pattern: the weights ``(B, H, L, S)`` the maths used, formed only while a hook is registered here.
        hook_qk: the post-rotary queries and keys with the converted mask, scale, window, soft-cap and sinks
            (:class:`~headwise.core.rows.AttentionRows`), handed over only while a hook is registered here.
    """

    def __init__(self):
        super().__init__()
        self.hook_heads, self.hook_pattern = HookPoint(), HookPoint()
        self.hook_qk = HookPoint()


_HOOKS: WeakKeyDictionary[nn.Module, AttentionHooks] = WeakKeyDictionary()


def hook_points(module: nn.Module) -> AttentionHooks:
    """The hook points of ``module`` (made on first use, kept beside the module — never added to it, so the
    model's modules, parameters and ``state_dict`` stay as they were); they act while it runs on headwise."""
    points = _HOOKS.get(module)
    if points is None:
        points = _HOOKS[module] = AttentionHooks()
    return points


# -- the mask --------------------------------------------------------------------------------------------------


def _split_mask(attention_mask, q: Tensor, k: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """A Hugging Face 4-D mask as headwise's ``(blocked, bias)``: bool True = may attend, float = added."""
    if attention_mask is None:
        return None, None
    if not isinstance(attention_mask, Tensor):
        raise TypeError(
            f"attention_mask: expected None or a 4-D tensor (the 'sdpa' / 'eager' formats), got "
            f"{type(attention_mask).__name__}"
        )
    B, H, L, _ = q.shape
    S = k.shape[-2]
    shape = tuple(attention_mask.shape)
    if (
        attention_mask.dim() != 4
        or shape[0] not in (1, B)
        or shape[1] not in (1, H)
        or shape[2] not in (1, L)
        or shape[3] != S
    ):
        raise ValueError(
            f"attention_mask: expected a shape broadcastable to (B, H, L, S)=({B}, {H}, {L}, {S}), got {shape}"
        )
    if attention_mask.dtype == torch.bool:
        return ~attention_mask, None  # HF / SDPA: True = may attend; headwise: True = may not
    if attention_mask.is_floating_point():
        return None, attention_mask
    raise TypeError(f"attention_mask: expected a bool or floating-point tensor, got dtype {attention_mask.dtype}")


_CALLS_INTERFACE: dict[object, bool] = {}


def calls_interface(code) -> bool:
    """Whether ``code`` — a class (its ``forward`` is read) or a modeling module — dispatches through
    transformers' ``AttentionInterface`` (its source names ``ALL_ATTENTION_FUNCTIONS``): the one probe of whether
    a module, or a family, can run on headwise. Read once per class or module; code whose source cannot be read
    counts as calling it (the model's own checks decide)."""
    if code not in _CALLS_INTERFACE:
        try:
            source = inspect.getsource(code.forward if isinstance(code, type) else code)
        except (OSError, TypeError):
            _CALLS_INTERFACE[code] = not isinstance(code, type)
        else:
            _CALLS_INTERFACE[code] = "ALL_ATTENTION_FUNCTIONS" in source
    return _CALLS_INTERFACE[code]


def refuse_off_interface(config) -> None:
    """ValueError naming the family when ``config``'s model writes its own attention (Falcon, BLOOM, MPT …): the
    modeling file beside the config's class does not call the interface (:func:`calls_interface`)."""
    name = type(config).__module__.replace(".configuration_", ".modeling_")
    modeling = sys.modules.get(name)
    if modeling is None or name == type(config).__module__:
        return  # not a transformers family we can read: let the model's own checks decide
    if not calls_interface(modeling):
        family = getattr(config, "model_type", type(config).__name__)
        raise ValueError(
            f"model: the {family!r} family writes its own attention instead of calling transformers' "
            f"AttentionInterface, so it cannot run on {NAME!r} attention"
        )


def build_mask(*args, config=None, **kwargs) -> Tensor | None:
    """The mask function registered for ``"headwise"``: transformers' ``sdpa_mask`` (see the module docstring).

    Returns a bool ``(B, 1, L, S)`` mask, True = may attend, or None (plain causal / bidirectional, no padding).
    Raises ValueError for a family whose attention does not go through the interface.
    """
    from transformers.masking_utils import sdpa_mask

    if config is not None:
        refuse_off_interface(config)
    return sdpa_mask(*args, **kwargs)


# -- the attention function ------------------------------------------------------------------------------------


def _refuse_unknown(kwargs: dict) -> None:
    for name, value in kwargs.items():
        if name in _NO_EFFECT or value is None:
            continue
        if name == "deterministic" and value is False:
            continue
        raise ValueError(
            f"{name}: the {NAME!r} attention backend does not support this argument (got {_describe(value)}); "
            f"load the model with another attn_implementation for it"
        )


def _describe(value) -> str:
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return repr(value)


def attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: Tensor | None = None,
    position_bias: Tensor | None = None,
    output_attentions: bool = False,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """The attention function registered as ``"headwise"`` in transformers' ``AttentionInterface``.

    Args:
        module: the calling attention module (its ``is_causal`` is read when no ``is_causal`` is passed).
        query: ``(B, H, L, Dh)``; key: ``(B, Hkv, S, Dh)``; value: ``(B, Hkv, S, Dv)`` — rotated and cached.
        attention_mask: None, or ``(B|1, 1|H, L|1, S)``: bool True = may attend (``sdpa_mask``), or float added.
        dropout, scaling, is_causal, sliding_window, softcap, s_aux, position_bias, output_attentions, kwargs:
            see the module docstring — each honoured or refused by name.
    Returns:
        ``(out (B, L, H, Dv), weights (B, H, L, S) or None)``; weights when ``output_attentions`` (a hook on the
        module's ``hook_pattern``, :func:`hook_points`, sees them whenever it is registered).
    Raises:
        ValueError / TypeError: a keyword headwise cannot honour, or a mask it cannot read.
    """
    _refuse_unknown(kwargs)
    L, S = query.shape[-2], key.shape[-2]
    blocked, bias = _split_mask(attention_mask, query, key)
    if position_bias is not None:
        bias = position_bias if bias is None else bias + position_bias
    causal, window = False, None
    if attention_mask is None:
        causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True)) and L > 1
        if sliding_window is not None and causal:
            window = sliding_window  # top-left aligned, as the causal flag
        elif sliding_window is not None and sliding_window < S:
            if L > 1 or getattr(module, "is_causal", True) is False:
                raise ValueError(
                    f"sliding_window: no mask arrived for a non-causal call with {S} keys > "
                    f"sliding_window={sliding_window}; headwise cannot place the window (build the mask with the "
                    f"registered {NAME!r} mask function)"
                )
            # one query and no mask: it is the last slot and sees the last `sliding_window` keys
            _, blocked = masks.causality(True, 1, S, q_offset=S - 1, window=sliding_window, device=query.device)
    # with a mask, the registered mask function built the window into it
    points = _HOOKS.get(module)
    call = AttentionCall(
        blocked=blocked, bias=bias, is_causal=causal, window=window, scale=scaling, softcap=softcap, sinks=s_aux,
        dropout_p=dropout, need_weights=bool(output_attentions),
    )  # fmt: skip
    call.check(query, key, value)
    out, weights = attend_hooked(points, query, key, value, call)  # (B, H, L, Dv), (B, H, L, S) or None
    return out.transpose(1, 2).contiguous(), weights  # (B, L, H, Dv)


def register() -> None:
    """Register ``"headwise"`` in transformers' ``AttentionInterface`` and ``AttentionMaskInterface``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, build_mask)
