"""A norm's algebra, whatever its class: read by probing it, frozen at a run's scale so that a sum of parts goes
through it part by part (the direct logit attribution, QK attribution, the composition scores' folded gains, the
wiring's norms on the writes and its input gradients).

Shape legend: N rows, D width.

Every norm the anatomy names is taken as ``y = C(x) · g · inv(x) + b``: ``C`` the centring of a LayerNorm (``x −
mean x``, linear) or nothing (an RMS norm), ``g`` the gain *as it acts*, ``b`` the bias, ``inv(x) = 1/sqrt(ms(C(x)) +
ε)`` the per-row scale. Nothing is read from a class name or a parameter's name: the bias is the norm's output at
0, the gain its output at a zero-mean probe (so ``nn.LayerNorm``, RMS norms of every layout, Gemma's ``1 + w``,
Nemotron's LayerNorm of ``1 + w``, Cohere's LayerNorm without bias and OLMo's LayerNorm without parameters or
epsilon read alike), the form (centred or not) and the per-row scale checked against the norm's actual outputs at
the run with the anatomy's one tolerance. Where the probed gain is the stored ``weight`` (the plain layout), the
stored tensor itself is used (so an ``nn.LayerNorm`` reads exactly its parameters).

    frozen = freeze(norm, x, y, what="layer 3's input norm")    # y = norm(x) at the run, or None: computed
    frozen(v) + frozen.bias                                     # the norm of x, and linear in v for parts of x
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from headwise.points import output_tensor

__all__ = ["FrozenNorm", "apply_qk_norm", "freeze", "norm_epsilon", "norm_vjp", "same", "TOLERANCE"]

#: Relative tolerance of "these two tensors are the same" (max |a − b| ≤ TOLERANCE · max(1, max |b|)), float32.
TOLERANCE = 1e-4
_EPS_NAMES = ("variance_epsilon", "eps", "epsilon", "variance_eps", "layer_norm_eps")
#: elements of the transient ``(N, n', L, D)`` input copies one norm vector–Jacobian product is taken on
_VJP_ELEMENTS = 1 << 23


def same(a: Tensor | None, b: Tensor | None, tol: float = TOLERANCE) -> bool:
    """Whether ``a`` and ``b`` have one shape and ``max |a − b| ≤ tol · max(1, max |b|)`` (the one check)."""
    if a is None or b is None or a.shape != b.shape:
        return False
    if b.numel() == 0:
        return True
    a, b = a.detach().double(), b.detach().double()
    return bool((a - b).abs().max() <= tol * max(1.0, float(b.abs().max())))


def norm_epsilon(norm: nn.Module) -> float | None:
    """A norm's epsilon, by the attribute names norms use (None when it names none)."""
    for name in _EPS_NAMES:
        value = getattr(norm, name, None)
        if isinstance(value, float):
            return value
    return None


@dataclass(frozen=True)
class FrozenNorm:
    """A norm at one run as ``y = lin(x) + bias`` with its scale frozen per row: ``lin(v) = C(v) · gain · inv``.

    Attributes:
        inv: ``(N,)`` float64, ``1/σ`` (LayerNorm) or ``1/rms`` (RMS norms) of each row of the run.
        gain: ``(D,)`` float64, the norm's gain as it acts (Gemma's and Nemotron's ``1 + w`` read as such).
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

    def fold(self, W: Tensor) -> Tensor:
        """``W (D, n)`` read through the norm's linear part without its scale: ``C diag(gain) W`` (the gain, and a
        LayerNorm's centring: ``(v − mean v)·G = v·(G − mean of G's rows)``)."""
        G = self.gain[:, None].to(W) * W
        return G - G.mean(0, keepdim=True) if self.centred else G

    def epsilon(self, x: Tensor) -> float | None:
        """The one ``ε`` with ``inv = (ms(C(x)) + ε)^-1/2`` at the run's rows ``x (N, D)`` (fitted: also for a norm
        that names none), or None where no single ``ε`` gives the frozen scale."""
        v = x.double() - x.double().mean(-1, keepdim=True) if self.centred else x.double()
        ms = v.pow(2).mean(-1).reshape(-1)
        inv = self.inv.double().reshape(-1).to(ms.device)
        eps = float((inv.pow(-2) - ms).mean())
        return eps if same((ms + eps).rsqrt(), inv) else None


def freeze(norm: nn.Module, x: Tensor, y: Tensor | None = None, *, what: str) -> FrozenNorm:
    """The norm ``norm`` at inputs ``x (N, D)`` frozen as a :class:`FrozenNorm`, checked against its outputs ``y
    (N, D)`` (None: ``norm(x)``, computed here): the bias and gain probed, the RMS form tried, then the LayerNorm
    form (see the module docstring).

    Raises:
        ValueError: the norm is neither form at this run (``what`` names it).
    """
    x64 = x.detach().double()
    if y is None:
        with torch.no_grad():
            y = output_tensor(norm(x))
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


def _stored(norm: nn.Module, name: str, probed: Tensor) -> Tensor:
    """The stored parameter ``name`` where the probe read it as it is stored (the plain layout), else ``probed``."""
    p = getattr(norm, name, None)
    if isinstance(p, Tensor) and p.shape == probed.shape:
        stored = p.detach().double().to(probed.device)
        if torch.allclose(stored, probed, rtol=1e-5, atol=1e-6):
            return stored
    return probed


def _probed(norm: nn.Module, x64: Tensor, y: Tensor, centred: bool) -> FrozenNorm | None:
    """A norm as ``(C(x) · g · inv) + b`` (``C`` the centring of a LayerNorm form, or nothing for an RMS form): the
    bias read at 0, the gain at a zero-mean probe; the per-row scale from the norm's epsilon, or, for a norm that
    names none (OLMo's), fitted to the run's rows by least squares. None when the form does not reproduce ``y``."""
    D = x64.shape[-1]
    param = next(norm.parameters(), None)
    dtype = param.dtype if param is not None else y.dtype
    u = _zero_mean_probe(D)
    with torch.no_grad():
        bias = output_tensor(norm(torch.zeros(1, D, dtype=dtype, device=x64.device)))[0].double()
        at_u = output_tensor(norm(u[None].to(dtype=dtype, device=x64.device)))[0].double()
    eps = norm_epsilon(norm)
    gain = (at_u - bias) / u.to(x64.device) * math.sqrt(float(u.pow(2).mean()) + (eps or 0.0))
    gain, bias = _stored(norm, "weight", gain), _stored(norm, "bias", bias)
    v = x64 - x64.mean(-1, keepdim=True) if centred else x64
    if eps is not None:
        inv = 1.0 / torch.sqrt(v.pow(2).mean(-1) + eps)  # (N,)
    else:
        target = (y.double() - bias) / gain.where(gain.abs() > 1e-12, torch.ones_like(gain))
        keep = gain.abs() > 1e-12
        inv = (v * target * keep).sum(-1) / (v.pow(2) * keep).sum(-1).clamp_min(1e-30)
    frozen = FrozenNorm(inv, gain, bias, centred)
    return frozen if same(frozen(x64) + frozen.bias, y.double()) else None


def norm_vjp(norm: nn.Module | None, r: Tensor, u: Tensor) -> Tensor:
    """``(N, n, L, D)``: the vector–Jacobian product of ``norm`` (None: the identity) at ``r (N, L, D)`` with each
    ``u[:, i]`` ``(N, n, L, D)``, taken on transient copies a few receivers at a time."""
    if norm is None:
        return u
    step = max(1, _VJP_ELEMENTS // max(1, r.numel()))
    parts = []
    for i in range(0, u.shape[1], step):
        c = u[:, i : i + step]
        with torch.enable_grad():
            x = r[:, None].expand(c.shape).to(c.dtype).clone().requires_grad_(True)
            parts.append(torch.autograd.grad(output_tensor(norm(x)), x, c)[0])
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


def apply_qk_norm(norm: nn.Module, t: Tensor) -> tuple[Tensor, bool] | None:
    """``t (…, n, Dh)`` through a QK-norm module, per head or over ``n·Dh`` (whichever its gain's size allows and
    runs): ``(result, per_head)``; None when neither layout runs."""
    weight = getattr(norm, "weight", None)
    wide = weight is not None and weight.numel() == t.shape[-2] * t.shape[-1] and t.shape[-2] > 1 and weight.dim() == 1
    tries = [(False, lambda: norm(t.flatten(-2)).reshape(t.shape))] if wide else []
    tries.append((True, lambda: norm(t)))
    for per_head, run in tries:
        try:
            with torch.no_grad():
                y = run()
        except (RuntimeError, ValueError):
            continue
        if isinstance(y, Tensor) and y.shape == t.shape:
            return y, per_head
    return None
