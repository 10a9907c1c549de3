"""Masks: the one place where headwise's mask convention is converted.

Convention (as ``torch.nn.MultiheadAttention``): a **boolean** mask is True where a query **may not**
attend; a **float** mask is added to the scores (``-inf`` blocks). Inside headwise a mask travels as
two parts, ``blocked`` (bool, True = may not attend) and ``bias`` (float, added), both broadcastable
to ``(B, H, L, S)``. ``to_sdpa`` converts them to what ``F.scaled_dot_product_attention`` wants (the
opposite boolean meaning), here and nowhere else.

Shape legend: B batch, H heads, L query length, S key length.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check_dtype(name: str, mask: Tensor) -> None:
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor (bool or float), got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"{name}: expected a bool or floating-point tensor, got dtype {mask.dtype}")


def causal(q_pos: Tensor, k_pos: Tensor, window: int | None = None, *, sink_tokens: int = 0) -> Tensor:
    """Bool ``(..., L, S)``: True where key ``j`` may not be seen by query ``i`` — the one causality rule.

    Blocked: keys after the query (``k_pos[j] > q_pos[i]``) and, with a sliding ``window`` W, keys W or
    more behind it (``k_pos[j] ≤ q_pos[i] − W``): query i sees the W positions ``i − W + 1 … i``, as
    Mistral and Hugging Face's ``sliding_window_causal_mask_function`` (``kv_idx > q_idx − W``).
    ``sink_tokens`` n: the keys at slots ``0 … n − 1`` stay visible whatever the window (StreamingLLM's
    attention sinks, Xiao et al. 2023). ``q_pos`` ``(..., L)`` and ``k_pos`` ``(..., S)`` are slots or token
    positions.
    """
    offset = k_pos[..., None, :] - q_pos[..., :, None]  # (..., L, S): j − i
    blocked = offset > 0
    if window is not None:
        behind = offset <= -window
        if sink_tokens:
            behind = behind & (k_pos[..., None, :] >= sink_tokens)
        blocked = blocked | behind
    return blocked


def causal_slots(
    L: int,
    S: int,
    *,
    offset: int = 0,
    window: int | None = None,
    key_slots: Tensor | None = None,
    sink_tokens: int = 0,
    device=None,
) -> Tensor | None:
    """:func:`causal` for queries at slots ``offset … offset + L − 1`` over keys at ``key_slots`` ``(S,)``
    (default ``0 … S − 1``; a ring cache's keys carry their stream indices).

    Returns ``(L, S)`` bool, or None when it blocks nothing (one new token after ``0 … S − 1`` within the
    window sees every key), so that decoding passes no mask to the kernel.
    """
    if key_slots is None:
        if L == 1 and offset == S - 1 and (window is None or window >= S):
            return None
        key_slots = torch.arange(S, device=device)
    q = torch.arange(offset, offset + L, device=key_slots.device)
    return causal(q, key_slots, window, sink_tokens=sink_tokens)


def causality(
    is_causal: bool,
    L: int,
    S: int,
    *,
    q_offset: int = 0,
    window: int | None = None,
    key_slots: Tensor | None = None,
    sink_tokens: int = 0,
    as_flag: bool = False,
    device=None,
) -> tuple[bool, Tensor | None]:
    """The one place causality becomes what a kernel takes: ``(flag, blocked)``.

    ``flag`` True: pass ``is_causal=True`` to ``F.scaled_dot_product_attention`` and build nothing — plain
    causality from the first slot (``q_offset`` 0, keys at ``0 … S − 1``, no window), when the caller allows
    it (``as_flag``: its kernel takes the top-left flag and no other mask joins it). Otherwise ``blocked``:
    :func:`causal_slots`'s ``(L, S)`` mask, or None when causality blocks nothing (or ``is_causal`` is False).

    Args:
        is_causal: whether the call is causal at all.
        L, S: query and key counts. q_offset: the first query's slot (``S − L`` after a cache).
        window, key_slots, sink_tokens: as :func:`causal_slots`.
        as_flag: the caller's kernel can take causality as its flag.
    """
    if not is_causal:
        return False, None
    if as_flag and key_slots is None and window is None and q_offset == 0:
        return True, None
    blocked = causal_slots(
        L, S, offset=q_offset, window=window, key_slots=key_slots, sink_tokens=sink_tokens, device=device
    )
    return False, blocked


def require_causal(is_causal: bool, window: int | None) -> None:
    """Raise ValueError when a module with a sliding ``window`` is called without ``is_causal`` (a window is a
    causal rule: it cannot be placed on a non-causal call)."""
    if window is not None and not is_causal:
        raise ValueError(f"is_causal: a module with sliding_window={window} attends causally; pass is_causal=True")


def narrowest(*windows: int | None) -> int | None:
    """The smallest of the windows that are not None (None: no window at all) — a module's and its cache's."""
    given = [w for w in windows if w is not None]
    return min(given) if given else None


def split(mask: Tensor | None, name: str) -> tuple[Tensor | None, Tensor | None]:
    """A user mask as ``(blocked, bias)``: bool masks block, float masks add."""
    if mask is None:
        return None, None
    _check_dtype(name, mask)
    return (mask, None) if mask.dtype == torch.bool else (None, mask)


def build(
    *,
    attn_mask: Tensor | None,
    key_padding_mask: Tensor | None,
    batch: int,
    heads: int,
    L: int,
    S: int,
    dtype: torch.dtype,
) -> tuple[Tensor | None, Tensor | None]:
    """Check a call's user masks and combine them into ``(blocked, bias)``.

    Causality is not a user mask here: it is decided by :func:`causal` where attention is computed.

    Args:
        attn_mask: ``(L, S)``, ``(B, L, S)`` or ``(B, H, L, S)``, bool or float.
        key_padding_mask: ``(B, S)``, bool (True = padding) or float (added).
        batch, heads, L, S: the call's sizes, for checking shapes.
        dtype: the scores' dtype, for float masks.
    Returns:
        ``blocked`` bool and ``bias`` float tensors of rank 4 (broadcastable to ``(B, H, L, S)``), or None.
    Raises:
        ValueError / TypeError: a mask whose shape does not fit or whose dtype is neither bool nor float.
    """
    blocked_parts: list[Tensor] = []
    bias_parts: list[Tensor] = []
    if attn_mask is not None:
        _check_dtype("attn_mask", attn_mask)
        shape = tuple(attn_mask.shape)
        if attn_mask.dim() == 2 and shape == (L, S):
            m = attn_mask[None, None]  # (1, 1, L, S)
        elif attn_mask.dim() == 3 and shape == (batch, L, S):
            m = attn_mask[:, None]  # (B, 1, L, S)
        elif attn_mask.dim() == 4 and shape == (batch, heads, L, S):
            m = attn_mask
        else:
            raise ValueError(
                f"attn_mask: expected shape (L, S)=({L}, {S}), (B, L, S)=({batch}, {L}, {S}) or "
                f"(B, H, L, S)=({batch}, {heads}, {L}, {S}), got {shape}"
            )
        (blocked_parts if m.dtype == torch.bool else bias_parts).append(m)
    if key_padding_mask is not None:
        _check_dtype("key_padding_mask", key_padding_mask)
        if tuple(key_padding_mask.shape) != (batch, S):
            raise ValueError(
                f"key_padding_mask: expected shape (B, S)=({batch}, {S}), got {tuple(key_padding_mask.shape)}"
            )
        m = key_padding_mask[:, None, None, :]  # (B, 1, 1, S)
        (blocked_parts if m.dtype == torch.bool else bias_parts).append(m)
    blocked = None
    for m in blocked_parts:
        blocked = either(blocked, m)
    total = None
    for m in bias_parts:
        total = added(total, m.to(dtype))
    return blocked, total


def either(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    """``a | b`` for bool masks, either of which may be None (nothing blocked)."""
    if a is None:
        return b
    return a if b is None else a | b


def added(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    """``a + b`` for score biases, either of which may be None (nothing added)."""
    if a is None:
        return b
    return a if b is None else a + b


def to_sdpa(blocked: Tensor | None, bias: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """The ``attn_mask`` of ``F.scaled_dot_product_attention``: bool True = *may* attend, or float added."""
    if bias is None:
        return None if blocked is None else ~blocked
    if blocked is None:
        return bias.to(dtype)
    return bias.to(dtype).masked_fill(blocked, float("-inf"))


def _all_last(m: Tensor) -> Tensor:
    """``m.all(-1, keepdim=True)`` for a bool tensor, as a byte minimum: the same answer, and on the CPU
    about 100 times faster than torch's boolean ``all`` on a ``(4, 1, 512, 512)`` padding mask."""
    return m.view(torch.uint8).amin(-1, keepdim=True).bool()


def dead_rows(blocked: Tensor | None, bias: Tensor | None) -> Tensor | None:
    """Bool ``(..., L, 1)``: True for query rows with every key blocked (or at ``-inf``); None if none can be."""
    dead = None
    if blocked is not None and bias is not None:
        dead = _all_last(blocked | torch.isneginf(bias))
    elif blocked is not None:
        dead = _all_last(blocked)
    elif bias is not None:
        dead = _all_last(torch.isneginf(bias))
    if dead is not None and not torch.compiler.is_compiling() and not bool(dead.any()):
        return None  # eager only: a data-dependent branch would break a compiled graph
    return dead
