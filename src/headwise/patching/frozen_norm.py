"""A norm at one run, frozen: ``y = C(x) · g · inv + b`` with its per-row scale ``inv`` held constant, so that it is
linear in its input and a sum of parts goes through it part by part (the direct logit attribution, QK attribution,
the composition scores' folded gains).

Shape legend: N rows, D width.

A ``nn.LayerNorm`` is read from its parameters; a norm of any other class (RMS norms of every layout, Gemma's
``1 + w``, Cohere's LayerNorm without bias, OLMo's LayerNorm without parameters or epsilon) is read by probing it:
its bias at 0, its gain at a zero-mean probe, its form (centred or not) and its per-row scale checked against its
actual outputs at the run (the anatomy's one tolerance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from headwise.models.anatomy import norm_epsilon, same
from headwise.points import output_tensor

__all__ = ["FrozenNorm", "freeze_norm", "frozen_parts"]


@dataclass(frozen=True)
class FrozenNorm:
    """A norm at one run as ``y = lin(x) + bias`` with its scale frozen per row: ``lin(v) = C(v) · gain · inv``.

    Attributes:
        inv: ``(N,)`` float64, ``1/σ`` (LayerNorm) or ``1/rms`` (RMS norms) of each row of the run.
        gain: ``(D,)`` float64, the norm's learned gain (Gemma's ``1 + w`` read as it acts).
        bias: ``(D,)`` float64, the norm's bias (zeros without one).
        centred: True for a LayerNorm (``C`` subtracts the mean over D, which is linear), else ``C`` = identity.
    """

    inv: Tensor
    gain: Tensor
    bias: Tensor
    centred: bool

    def __call__(self, v: Tensor) -> Tensor:
        """``lin`` on parts ``(N, …, D)`` (rows first, as the run's rows)."""
        if self.centred:
            v = v - v.mean(-1, keepdim=True)
        inv = self.inv.to(v.device).reshape(self.inv.shape[0], *([1] * (v.dim() - 1)))
        return v * self.gain.to(v.device) * inv


def freeze_norm(norm: nn.Module, x: Tensor, y: Tensor, what: str) -> FrozenNorm:
    """The norm ``norm`` at inputs ``x (N, D)`` frozen as a :class:`FrozenNorm`, checked against its actual
    outputs ``y (N, D)``: a ``nn.LayerNorm`` read from its parameters, a norm of any other class in the LayerNorm or
    the RMS form read by probing it (:func:`_probed`).

    Raises:
        ValueError: the norm is neither form at this run (``what`` names it).
    """
    D = x.shape[-1]
    x64 = x.double()
    if isinstance(norm, nn.LayerNorm):
        inv = 1.0 / torch.sqrt(x64.var(-1, unbiased=False) + norm.eps)  # (N,)
        gain = norm.weight.detach().double() if norm.weight is not None else torch.ones(D, dtype=torch.float64)
        bias = norm.bias.detach().double() if norm.bias is not None else torch.zeros(D, dtype=torch.float64)
        frozen = FrozenNorm(inv, gain.to(x.device), bias.to(x.device), True)
        frozen = frozen if same(frozen(x64) + frozen.bias, y.double()) else None
    else:  # each form checked against y by _probed
        frozen = next((f for centred in (False, True) if (f := _probed(norm, x64, y, centred)) is not None), None)
    if frozen is None:
        raise ValueError(
            f"model: the {what} ({type(norm).__name__}) is neither a LayerNorm nor an RMS norm x·g/rms(x) + b "
            "at this run; its scale cannot be frozen"
        )
    return frozen


def _zero_mean_probe(D: int) -> Tensor:
    """``(D,)`` float64 of ±1 and 2 with mean 0 and no zero entry (every column's gain is read)."""
    u = torch.ones(D, dtype=torch.float64)
    u[1::2] = -1.0
    if D % 2:
        u[-3:] = torch.tensor([2.0, -1.0, -1.0], dtype=torch.float64) if D >= 3 else u[-3:]
    return u


def _probed(norm: nn.Module, x64: Tensor, y: Tensor, centred: bool) -> FrozenNorm | None:
    """A norm of any class as ``(C(x) · g · inv) + b`` (``C`` the centring of a LayerNorm form, or nothing for an
    RMS form): the bias read at 0, the gain at a zero-mean probe; the per-row scale from the norm's epsilon, or,
    for a norm that names none (OLMo's), fitted to the run's rows by least squares. None when the form does not
    reproduce ``y``."""
    D = x64.shape[-1]
    param = next(norm.parameters(), None)
    dtype = param.dtype if param is not None else y.dtype
    u = _zero_mean_probe(D)
    with torch.no_grad():
        bias = output_tensor(norm(torch.zeros(1, D, dtype=dtype, device=x64.device)))[0].double()
        at_u = output_tensor(norm(u[None].to(dtype=dtype, device=x64.device)))[0].double()
    eps = norm_epsilon(norm)
    gain = (at_u - bias) / u.to(x64.device) * math.sqrt(float(u.pow(2).mean()) + (eps or 0.0))
    v = x64 - x64.mean(-1, keepdim=True) if centred else x64
    if eps is not None:
        inv = 1.0 / torch.sqrt(v.pow(2).mean(-1) + eps)  # (N,)
    else:
        target = (y.double() - bias) / gain.where(gain.abs() > 1e-12, torch.ones_like(gain))
        keep = gain.abs() > 1e-12
        inv = (v * target * keep).sum(-1) / (v.pow(2) * keep).sum(-1).clamp_min(1e-30)
    frozen = FrozenNorm(inv, gain, bias, centred)
    return frozen if same(frozen(x64) + frozen.bias, y.double()) else None


def frozen_parts(norm: nn.Module, x: Tensor, y: Tensor, what: str):
    """``(lin, bias)``: the norm at ``x (P, D)`` as ``y = lin(x) + bias``, its scale frozen; ``lin`` acts on
    ``(P, …, D)`` parts. Checked against the norm's actual output ``y``."""
    frozen = freeze_norm(norm, x, y, what)
    return frozen, frozen.bias
