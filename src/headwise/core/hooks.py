"""``HookPoint``: one named place in a forward pass where tools act on a tensor.

Shape legend: B batch, H query heads, L query length, S key length, Dh head width.

TransformerLens's idea (``hook_points.py``): an identity ``nn.Module`` placed on a tensor's path. Gates,
ablation, capture and patching register a hook on the point instead of each reaching into attention by its
own route. Every attention module of headwise has three, and the Hugging Face backend gives each attention
module of a model the same three (:func:`headwise.hf.backend.hook_points`):

- ``hook_heads`` — the per-head outputs ``(B, H, L, Dh)`` just before the heads are merged for the output
  projection (``Wo``, ``o_proj``): where a head meets W_O. A hook may return a replacement (gates, ablation,
  patching) or None (reading).
- ``hook_pattern`` — the attention weights ``(B, H, L, S)`` the maths used. Read-only: the output is already
  computed when it is called, so a returned tensor changes nothing. While a hook is registered the module
  asks the maths for the weights (as TransformerLens's ``hook_pattern``); with none, no ``L × S`` weights are
  formed.
- ``hook_qk`` — the post-rotary queries ``(B, H, L, Dh)`` and keys ``(B, Hkv, S, Dh)`` with the scale, masks,
  causality, window, key slots, soft-cap and sinks, as one :class:`~headwise.core.rows.AttentionRows`: a reader
  forms every head's weights a block of query rows at a time, exactly as the model does (streaming statistics),
  never ``(B, H, L, S)`` at once. Read-only; the object is built only while a hook is registered.

The contract of the three — what each sees, in which order, and when the weights are formed — is written once,
in :func:`attend_hooked`, the step every attention module (:class:`~headwise.core.attention.MultiHeadAttention`,
:class:`~headwise.core.latent.LatentAttention`) and the Hugging Face backend (:mod:`headwise.hf.backend`) calls:
``hook_qk`` → the attention → ``hook_pattern`` → ``hook_heads``.

Unused, a point costs one module call that returns its input (measured: below the noise of a forward,
``docs/architecture.md``). A hook is ``fn(x) -> replacement or None``; :meth:`HookPoint.add_hook` returns
the handle that removes it, :func:`hooked` adds several for the length of a block.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Protocol

from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from headwise.core.call import AttentionCall
from headwise.core.dispatch import attend
from headwise.core.rows import AttentionRows

__all__ = ["AttentionPoints", "HookPoint", "attend_hooked", "hooked"]

Hook = Callable[[Tensor], "Tensor | None"]


class HookPoint(nn.Module):
    """An identity module: ``point(x)`` returns ``x`` after every hook registered on it has seen it.

    Hooks run in the order they were added; each sees the previous one's replacement.
    """

    def forward(self, x: Tensor) -> Tensor:
        return x

    @property
    def active(self) -> bool:
        """Whether a hook is registered here (a module asks for tensors it would not form otherwise)."""
        return bool(self._forward_hooks or self._forward_pre_hooks)

    def add_hook(self, fn: Hook) -> RemovableHandle:
        """Register ``fn(x) -> replacement or None``; ``handle.remove()`` takes it off."""
        if not callable(fn):
            raise TypeError(f"fn: expected a callable fn(tensor) -> tensor or None, got {type(fn).__name__}")

        def hook(_module, _args, output):
            return fn(output)

        return self.register_forward_hook(hook)


@contextmanager
def hooked(hooks: Iterable[tuple[HookPoint, Hook]]) -> Iterator[None]:
    """Inside the block, each ``(point, fn)`` pair's hook is registered; all are removed after, also on error."""
    handles: list[RemovableHandle] = []
    try:
        for point, fn in hooks:
            if not isinstance(point, HookPoint):
                raise TypeError(f"hooks: expected (HookPoint, fn) pairs, got a {type(point).__name__}")
            handles.append(point.add_hook(fn))
        yield
    finally:
        for handle in handles:
            handle.remove()


class AttentionPoints(Protocol):
    """The three points of one attention module: the module itself (headwise's), or the points the Hugging Face
    backend keeps beside a model's module (:func:`headwise.hf.backend.hook_points`)."""

    hook_qk: HookPoint
    hook_pattern: HookPoint
    hook_heads: HookPoint


def attend_hooked(
    points: AttentionPoints | None,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    call: AttentionCall,
    heads: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """One attention call through its three hook points — the contract, written once.

    1. ``hook_qk``, while hooked: :class:`~headwise.core.rows.AttentionRows` ``(q, k, call)`` — the post-rotary
       queries and keys with the call exactly as it is attended (read-only).
    2. The attention (:func:`headwise.core.dispatch.attend`); while ``hook_pattern`` is hooked the weights are
       asked for, per head, whatever the caller asked.
    3. ``hook_pattern``, while hooked: every head's weights ``(B, H, L, S)`` (read-only: the output is already
       computed). The caller then gets the weights it asked for (``call.need_weights``, averaged over heads with
       ``call.average_heads``), or None.
    4. ``hook_heads``: the per-head outputs ``(B, H, L, Dv)`` where the heads meet the output projection; a hook
       may replace them.

    Args:
        points: the module's points, or None (no points: the attention alone).
        q: ``(B, H, L, Dh)``; k: ``(B, Hkv, S, Dh)``; v: ``(B, Hkv, S, Dv)``; call: the rest of the call.
        heads: maps the attention's output to the per-head outputs ``(B, H, L, Dv)`` before ``hook_heads``
            (the absorbed latent path's ``W_UV``), or None when they are the same.
    Returns:
        ``(out (B, H, L, Dv), weights (B, H, L, S) / (B, L, S) or None)``.
    """
    if points is None:
        out, weights = attend(q, k, v, call)
        return (out if heads is None else heads(out)), weights
    if points.hook_qk.active:  # a reader of every head's rows, a block at a time (streaming statistics)
        points.hook_qk(AttentionRows(q, k, call))
    watched = points.hook_pattern.active
    if not watched:
        out, weights = attend(q, k, v, call)
    else:  # a hook reads the pattern: it sees every head's weights, the caller what it asked for
        out, weights = attend(q, k, v, call.replace(need_weights=True, average_heads=False))
        points.hook_pattern(weights)  # (B, H, L, S)
        weights = (weights.mean(dim=1) if call.average_heads else weights) if call.need_weights else None
    out = out if heads is None else heads(out)  # (B, H, L, Dv)
    return points.hook_heads(out), weights  # (B, H, L, Dv): each head's output where the heads meet W_O
