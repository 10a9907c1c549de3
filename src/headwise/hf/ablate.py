"""Head ablation at the right place: where a head's output enters the output projection.

transformers 5 removed ``head_mask``; zeroing a slice of ``o_proj``'s *output* mixes every head. A head's
contribution is its slice of ``o_proj``'s *input*: the attention output ``(B, L, H, Dv)`` that the model
reshapes to ``(B, L, H·Dv)`` for ``o_proj`` (GPT-2's ``c_proj``, BERT's ``attention.output.dense``). Inside
``with ablate(model, {layer: [head, …]}):`` the model runs on headwise attention and those heads' slices are
replaced there, at each layer's ``hook_heads`` (:func:`headwise.hf.backend.hook_points`), before the
projection — equal to editing ``o_proj``'s input (tested ≤ 1e-5) — by :func:`headwise.replacement.replace_heads`, the
function the batched engine replaces heads with.

Shape legend: B batch, L query length, H query heads, Dv value head width.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial

import torch
from torch import Tensor, nn

from headwise.checks import head_number, layer_number, one_of
from headwise.hf._model import named_points, num_heads, on_headwise
from headwise.points import attention_point
from headwise.replacement import MODES, replace_heads


class _PaddingMasks:
    """The 2-D padding mask of each running ``PreTrainedModel`` call, innermost last (for ``mode="mean"``)."""

    def __init__(self, model: nn.Module):
        from transformers import PreTrainedModel

        self.stack: list[Tensor | None] = []
        self._handles = []
        for module in model.modules():
            if isinstance(module, PreTrainedModel):
                signature = inspect.signature(module.forward)
                if "attention_mask" not in signature.parameters:
                    continue
                self._handles.append(module.register_forward_pre_hook(self._push(signature), with_kwargs=True))
                self._handles.append(module.register_forward_hook(self._pop, always_call=True))

    def _push(self, signature: inspect.Signature):
        def hook(module, args, kwargs):
            self.stack.append(signature.bind_partial(*args, **kwargs).arguments.get("attention_mask"))

        return hook

    def _pop(self, module, args, output):
        if self.stack:
            self.stack.pop()

    def real(self, B: int, L: int, device: torch.device) -> Tensor:
        """Bool ``(B, L)``: True for the current call's real (non-padding) query positions."""
        mask = self.stack[-1] if self.stack else None
        if mask is None:
            return torch.ones(B, L, dtype=torch.bool, device=device)
        if not isinstance(mask, Tensor) or mask.dim() != 2 or mask.shape[0] != B or mask.shape[1] < L:
            shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
            raise ValueError(
                f"attention_mask: mode='mean' needs the model's 2-D padding mask (B, S) with B={B} and S >= {L}, "
                f"or None, got {shape}"
            )
        return mask[:, -L:].to(device) != 0  # the queries are the last L positions of the mask

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


class _Ablation:
    """A ``hook_heads`` hook removing heads through :func:`headwise.replacement.replace_heads` (one copy of the batch:
    the function the batched engine replaces heads with)."""

    def __init__(self, mode: str, padding: _PaddingMasks | None):
        self._mode = mode
        self._padding = padding

    def __call__(self, heads: list[int], out: Tensor) -> Tensor:
        """``out (B, H, L, Dv)`` with ``heads`` removed (a ``hook_heads`` hook)."""
        if not heads:
            return out
        B, H, L, Dv = out.shape
        if max(heads) >= H:
            raise ValueError(f"heads: head {max(heads)} is out of range for an attention call with {H} heads")
        keep = torch.zeros(1, H, dtype=torch.bool, device=out.device)  # (J = 1, H)
        keep[0, heads] = True
        real = None
        if self._mode == "mean":
            real = self._padding.real(B, L, out.device)  # (B, L)
            if not bool(real.any()):
                raise ValueError("attention_mask: mode='mean' found no real (non-padding) position in the batch")
        return replace_heads(out, keep, 1, self._mode, real)


def _check_heads(heads, modules: list[nn.Module]) -> dict[int, list[int]]:
    """``{layer: sorted distinct heads}``, every number checked against the model."""
    if not isinstance(heads, Mapping):
        raise TypeError(f"heads: expected a mapping {{layer: [head, ...]}}, got {type(heads).__name__}")
    chosen: dict[int, list[int]] = {}
    for layer, numbers in heads.items():
        layer_number("heads", layer, len(modules))
        if isinstance(numbers, (int, str, bytes)) or not isinstance(numbers, Iterable):
            raise TypeError(f"heads: expected a list of head numbers for layer {layer}, got {numbers!r}")
        H = num_heads(modules[layer])
        chosen[layer] = sorted({head_number("heads", head, layer, H) for head in numbers})
    return chosen


@contextmanager
def ablate(model: nn.Module, heads: Mapping[int, Iterable[int]], *, mode: str = "zero") -> Iterator[None]:
    """Remove heads' contributions where they enter the output projection, inside the block.

    Args:
        model: a transformers ``PreTrainedModel`` on the attention interface.
        heads: ``{layer: [head, ...]}``; layer numbers as in :func:`headwise.hf.attention_layers`.
        mode: ``"zero"`` sets each head's slice ``(B, L, Dv)`` of the output projection's input to 0 — equal to
            zeroing that slice of ``o_proj``'s input. ``"mean"`` replaces it, at every position, by its mean
            over the real (non-padding) positions of the batch in the same forward call (mean ablation; the
            padding comes from the ``attention_mask`` given to the model, all positions when there is none;
            under ``generate`` each step averages over its own new tokens).
    Raises:
        TypeError / ValueError: not a ``PreTrainedModel``; a family that writes its own attention (named);
            ``mode`` not one of ``("zero", "mean")``; a layer or head number out of range (named).

    The model runs on headwise attention inside the block and gets back its own implementation after, also
    when the block raises.
    """
    one_of("mode", mode, MODES)
    points = named_points(model)
    chosen = _check_heads(heads, points.attention)
    padding = _PaddingMasks(model) if mode == "mean" else None
    ablation = _Ablation(mode, padding)
    try:
        hooks = {attention_point(layer, "heads"): partial(ablation, heads) for layer, heads in chosen.items()}
        with points.hooks(hooks), on_headwise(model):
            yield
    finally:
        if padding is not None:
            padding.close()
