"""The fast projections — beside the maths, never inside it.

Nothing here is needed by the readable path (``backend="math"`` calls each ``nn.Linear`` as a module). Each
function computes what calling the Linears computes, faster, and is tested to agree with it
(``tests/core/test_fast_paths.py``):

- :func:`linear`: ``F.linear`` through oneDNN's matmul with the bias added in the kernel's epilogue, in the dtypes
  oneDNN computes on this CPU (:mod:`headwise.core.cpu`: bf16 needs AVX-512 or AMX) (a single
  row too: a decoded token's projection, where oneDNN reads the weight on every thread and MKL's ``addmv`` on
  one); a few float32 rows by a weight of at least 16 MB through the compiled ``kernels.linear_rows``;
- :func:`project`: a module's Q/K/V projections as one product when they share an input, the stacked weight
  kept per weight version (:func:`stacked`, also the compiled decode step's weight).

Under ``torch.compile`` each steps aside for the plain operation (TorchInductor fuses on its own, and cannot
lower oneDNN's private operator).

Shape legend: B batch, L query length, S key length, H query heads, Hkv key/value heads, Dh head width,
In / Out a projection's widths.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headwise.core import cpu, kernels
from headwise.core.guards import differentiated

# Fewest tokens (B·S) for which Q/K/V (or K/V) run as one product while the stacked weight is formed per call
# (autograd records, or the weights carry no version counter), which short inputs do not repay. Otherwise the
# stacked weight is kept, and one product pays at any length — most of all for a decoded token, where it turns
# three matrix-vector products into one.
FUSE_MIN_TOKENS = 1024


def _onednn_applies(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """Whether oneDNN's linear gives exactly ``F.linear``'s result here: CPU plain tensors in a dtype oneDNN computes
    on this CPU (float32; bf16 where :func:`headwise.core.cpu.capabilities` says so — AVX-512 or AMX, not AVX2), no
    gradient recorded, no autocast, not inside ``torch.compile``."""
    if torch.compiler.is_compiling():
        return False
    if type(x) is not Tensor or x.device.type != "cpu" or x.dtype not in cpu.capabilities().linear_dtypes:
        return False
    if x.dim() < 2 or weight.dtype != x.dtype or weight.device.type != "cpu" or x.numel() == 0:
        return False
    if bias is not None and bias.dtype != x.dtype:
        return False
    if torch.is_autocast_enabled("cpu"):
        return False
    return not differentiated(x, weight, bias)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``: ``x Wᵀ + b``, ``(..., In) -> (..., Out)``.

    On the CPU in float32 / bfloat16 with no gradient recorded, oneDNN's matmul with the bias added in
    its epilogue (``torch.ops.mkldnn._linear_pointwise``, the operator TorchInductor's CPU path emits)
    instead of ``addmm``, which first copies the bias into the output and, in float32, calls MKL — bf16 only
    where oneDNN computes bf16 on this CPU (:func:`headwise.core.cpu.capabilities`; with AVX2 alone it cannot
    create the primitive). The result equals ``F.linear``'s up to round-off (tested). Everything else is
    ``F.linear``.
    """
    if _onednn_applies(x, weight, bias):
        if kernels.enabled and kernels.linear_rows_applies(x, weight, bias):
            return kernels.linear_rows(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def plain(m: nn.Module) -> bool:
    """A plain ``nn.Linear`` holding plain tensors (not a subclass, not DTensor shards), without hooks
    (a module someone hooked — head gates, probes — is called as a module, so that its hooks run)."""
    if type(m) is not nn.Linear or m._forward_pre_hooks or m._forward_hooks:
        return False
    return all(type(p) in (nn.Parameter, Tensor) for p in (m.weight, m.bias) if p is not None)


def call_linear(m: nn.Module, x: Tensor) -> Tensor:
    """``m(x)``: a plain ``nn.Linear`` through :func:`linear` (its ``forward`` is not called), any other
    module (a subclass, DTensor shards, a hooked Linear) called as a module."""
    return linear(x, m.weight, m.bias) if plain(m) else m(x)


def _tensors(linears: tuple[nn.Linear, ...]) -> list[Tensor]:
    return [p for m in linears for p in (m.weight, m.bias) if p is not None]


def keepable(linears: tuple[nn.Linear, ...]) -> bool:
    """Whether a stacked copy of these Linears' weights can be kept and known stale: their tensors track a
    version counter. Tensors made under ``torch.inference_mode()`` (a module built or deep-copied there) do not,
    and an in-place change of them (``load_state_dict`` inside inference mode) could not be seen."""
    return not any(p.is_inference() for p in _tensors(linears))


class _StackedWeights:
    """Concatenated ``(weight (ΣOut, In), bias (ΣOut,) or None)`` of several ``nn.Linear``s.

    While no gradient is recorded the concatenation is kept and reused until one of the weights is
    replaced or changed in place (its version counter moves: ``load_state_dict``, an optimiser step,
    ``.copy_``). With autograd — or for inference tensors, which have no version counter — it is formed per
    call, so that gradients reach each Linear's own weight and no change goes unseen.
    """

    def __init__(self):
        self._key = None
        self._value = None

    def __call__(self, linears: tuple[nn.Linear, ...]) -> tuple[Tensor, Tensor | None]:
        tensors = _tensors(linears)
        if torch.is_grad_enabled() and any(p.requires_grad for p in tensors):
            return self._concat(linears)
        try:
            key = tuple((id(p), p._version, p.dtype, p.device) for p in tensors)
        except RuntimeError:  # an inference tensor: no version counter, so nothing can be kept
            self._key = self._value = None
            return self._concat(linears)
        if key != self._key:
            with torch.no_grad():
                self._value = self._concat(linears)
            self._key = key
        return self._value

    @staticmethod
    def _concat(linears):
        weight = torch.cat([m.weight for m in linears])  # (ΣOut, In)
        bias = None if linears[0].bias is None else torch.cat([m.bias for m in linears])  # (ΣOut,)
        return weight, bias


def stacked(module: nn.Module, linears: tuple[nn.Linear, ...]) -> tuple[Tensor, Tensor | None]:
    """The stacked ``(weight, bias)`` of ``linears``, kept on ``module`` (not as a parameter, buffer or state)
    while no weight changes (:class:`_StackedWeights`)."""
    store = module.__dict__.setdefault("_fused_weights", {})
    return store.setdefault(len(linears), _StackedWeights())(linears)


def forget_stacked(module: nn.Module) -> None:
    """Drop the stacked weights :func:`stacked` keeps on ``module`` (its weights were released: a layer brought in
    and out again, :mod:`headwise.models.streamed`; a new weight could reuse a released one's ``id``)."""
    module.__dict__.pop("_fused_weights", None)


def _stacked_per_call(linears: tuple[nn.Linear, ...], x: Tensor) -> bool:
    """Whether a stacked weight of ``linears`` would be formed per call for input ``x``: autograd records the
    projection, or the weights are inference tensors (:func:`keepable`)."""
    tensors = _tensors(linears)
    if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in tensors)):
        return True
    return any(p.is_inference() for p in tensors)


def project(module: nn.Module, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(Wq(query) (B, L, H·Dh), Wk(key) (B, S, Hkv·Dh), Wv(value) (B, S, Hkv·Dh))`` for a module holding
    ``Wq``, ``Wk``, ``Wv`` (:class:`headwise.MultiHeadAttention`), the same numbers as calling the three
    ``nn.Linear``s.

    When the three inputs are one tensor (self-attention) — and, where the stacked weight is formed per call
    (autograd records; inference tensors), hold at least ``FUSE_MIN_TOKENS`` tokens — one matrix product with
    ``Wq; Wk; Wv`` stacked (as ``nn.MultiheadAttention``'s ``in_proj_weight`` and gpt-fast's ``wqkv``); keys
    and values likewise when they share an input. The Linears' ``forward`` (and hooks on them) is not called:
    a caller that hooks them sets ``module.fast_projections = False``.
    """
    fuse: tuple[nn.Linear, ...] = ()
    if not torch.compiler.is_compiling() and key is value:
        if query is key and all(plain(m) for m in (module.Wq, module.Wk, module.Wv)):
            fuse = (module.Wq, module.Wk, module.Wv)
        elif plain(module.Wk) and plain(module.Wv):
            fuse = (module.Wk, module.Wv)
        if fuse and key.shape[0] * key.shape[1] < FUSE_MIN_TOKENS and _stacked_per_call(fuse, key):
            fuse = ()
    if not fuse:
        return call_linear(module.Wq, query), call_linear(module.Wk, key), call_linear(module.Wv, value)
    weight, bias = stacked(module, fuse)
    parts = linear(key, weight, bias).split([m.out_features for m in fuse], dim=-1)  # (B, S, Out) each
    if len(fuse) == 3:
        return parts
    return (call_linear(module.Wq, query), *parts)
