"""When the fast paths step aside: what every one of them asks before it computes a call.

The fast kernels (oneDNN's linear, one-query attention, the compiled decode step) have no derivative
formulas, cannot be traced by ``torch.compile`` and do not see hooks registered for every module; each asks
here, so that the answer is the same for all of them.
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as fwad
from torch import Tensor
from torch.nn.modules import module as _torch_module

__all__ = ["derivatives_possible", "differentiated", "forward_mode", "global_hooks"]


def differentiated(*tensors: Tensor | None) -> bool:
    """Whether a derivative is being taken through these tensors: autograd records them (reverse mode), or a
    forward-mode level is open (``torch.autograd.forward_ad.dual_level``) and one of them carries a tangent.
    The fast kernels have no derivative formulas of either kind, so they step aside in both cases."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return True
    return forward_mode(*tensors)


def forward_mode(*tensors: Tensor | None) -> bool:
    """Whether one of these tensors carries a forward-mode tangent (inside ``forward_ad.dual_level``)."""
    if fwad._current_level < 0:  # no dual level open: no tangent can exist
        return False
    return any(t is not None and fwad.unpack_dual(t).tangent is not None for t in tensors)


def derivatives_possible() -> bool:
    """Whether any derivative could be recorded now (autograd on, or a forward-mode level open): when False,
    :func:`differentiated` is False for every tensor and need not be asked."""
    return torch.is_grad_enabled() or fwad._current_level >= 0


def global_hooks() -> bool:
    """Whether hooks registered for every module exist (``nn.modules.module.register_module_forward_hook``)."""
    return bool(_torch_module._global_forward_hooks or _torch_module._global_forward_pre_hooks)
